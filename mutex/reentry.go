package mutex

import (
	"context"
	"fmt"
	"time"
)

// ownerKey is the context key under which Lock.Context stores the holds a
// context carries, as a chain (a zero-size key: looking it up allocates
// nothing, unlike a key holding the Locker and the name).
type ownerKey struct{}

// An owner is one link of that chain.
type owner struct {
	hold *hold
	next *owner
}

// ownerOf returns the hold of name and l that ctx carries, or nil.
func ownerOf(ctx context.Context, l *Locker, name string) *hold {
	for o, _ := ctx.Value(ownerKey{}).(*owner); o != nil; o = o.next {
		if o.hold.locker == l && o.hold.name == name {
			return o.hold
		}
	}
	return nil
}

// reenter adds a handle to h, which ctx carries: the hold count in Redis
// goes up by one. The hold is busy meanwhile (Lock.use), so that its last
// handle is not handed over locally while the re-entry is on its way.
func (l *Locker) reenter(ctx context.Context, h *hold, cfg lockConfig, call *Call) (*Lock, time.Duration, any, error) {
	if h.enter() != nil {
		return nil, -1, nil, fmt.Errorf("%w: re-entry of %q, whose owning lock has ended", ErrNotHeld, h.name)
	}
	defer h.exit()
	id := h.nextID.Add(1)
	start := time.Now()
	r, res, err := l.dep.acquire(ctx, l, h.name, &h.names, cfg, call, argID(id), start)
	switch {
	case err != nil && h.hasEnded():
		// The owning lock ended meanwhile (its lease ran out; a ctx it
		// carries ends then too, which may be what stopped the call).
		return nil, -1, nil, fmt.Errorf("%w: re-entry of %q, whose owning lock ended meanwhile", ErrNotHeld, h.name)
	case err != nil:
		return nil, -1, nil, fmt.Errorf("mutex: acquire %q: %w", h.name, err)
	case r[0] == declinedReply:
		return nil, -1, res, ErrDeclined
	case r[0] != 1:
		h.lose()
		return nil, -1, res, fmt.Errorf("%w: re-entry of %q, whose owning lock is gone from Redis", ErrNotHeld, h.name)
	}
	lk := &Lock{hold: h, id: id}
	h.add(lk, start, time.Duration(r[1])*time.Millisecond)
	if cfg.renew {
		h.startRenew(h, cfg.ttl)
	}
	return lk, -1, res, nil
}
