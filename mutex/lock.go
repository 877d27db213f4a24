package mutex

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Run runs call.Fragment only while this handle holds the lock, without
// releasing it, and returns its result; ErrNotHeld (not run) when the handle
// no longer holds the lock; ErrDeclined with the result when call.Fragment
// is a gate that declined (the lock stays held). Unlike a release, Run keeps
// no record: a run that go-redis repeats after a lost reply runs the
// fragment twice, so give Run fragments that read, or writes that can run
// twice (a SET, not an INCR).
func (lk *Lock) Run(ctx context.Context, call Call) (any, error) {
	if ctx == nil {
		return nil, ErrNilContext
	}
	if err := call.check(); err != nil {
		return nil, err
	}
	if err := lk.use(); err != nil {
		return nil, err
	}
	defer lk.unuse()
	h := lk.hold
	if err := h.locker.unsupported("a Fragment"); err != nil {
		return nil, err
	}
	keys, args := scriptCall(&call, &names{key: h.key}, false, h.token, argID(lk.id))
	reply, short, err := h.locker.runAcked(ctx, call.Fragment.held, keys, args, nil)
	if err != nil {
		return nil, fmt.Errorf("mutex: run %q: %w", h.name, err)
	}
	r, rest, err := ints(reply, 1)
	if err != nil {
		return nil, err
	}
	switch r[0] {
	case 0:
		h.lose()
		return nil, ErrNotHeld
	case declinedReply:
		return rest, ErrDeclined // the gate's table: its result is all of it
	}
	var res any
	if len(rest) > 0 {
		res = rest[0]
	}
	if short != nil {
		return res, fmt.Errorf("mutex: run %q: %w", h.name, short)
	}
	return res, nil
}

// Extend sets the remaining lease of the lock to ttl (which may shorten it).
// It returns ErrNotHeld when the lock is no longer held by this handle.
func (lk *Lock) Extend(ctx context.Context, ttl time.Duration) error {
	if ctx == nil {
		return ErrNilContext
	}
	if err := checkDuration("lease", ttl); err != nil {
		return err
	}
	if err := lk.use(); err != nil {
		return err
	}
	defer lk.unuse()
	start := time.Now()
	ok, err := lk.hold.locker.dep.extend(ctx, lk.hold, handleID(lk.id), ttl, start)
	if err != nil {
		return fmt.Errorf("mutex: extend %q: %w", lk.hold.name, err)
	}
	if !ok {
		lk.hold.lose()
		return ErrNotHeld
	}
	lk.hold.setDeadline(leaseEnd(start, ttl))
	return nil
}

// TTL returns the remaining lease of the lock as Redis sees it, or ErrNotHeld.
func (lk *Lock) TTL(ctx context.Context) (time.Duration, error) {
	if ctx == nil {
		return 0, ErrNilContext
	}
	if err := lk.use(); err != nil {
		return 0, err
	}
	defer lk.unuse()
	d, err := lk.hold.locker.dep.pttl(ctx, lk)
	switch {
	case errors.Is(err, ErrNotHeld):
		lk.hold.lose()
		return 0, ErrNotHeld
	case err != nil:
		return 0, fmt.Errorf("mutex: ttl %q: %w", lk.hold.name, err)
	}
	return d, nil
}

// pttl reads the lease lk's lock has left in Redis.
func (single) pttl(ctx context.Context, lk *Lock) (time.Duration, error) {
	reply, err := lk.hold.locker.run(ctx, pttlScript, []string{lk.hold.key}, []any{lk.hold.token, argID(lk.id)}, nil)
	if err != nil {
		return 0, err
	}
	ms, err := integer(reply)
	if err != nil {
		return 0, err
	}
	if ms == -3 {
		return 0, ErrNotHeld
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// extend sets the lease of h's handle id ("" for any handle: renewal) in
// the Locker's Redis. It reports false when the lock is no longer held.
func (single) extend(ctx context.Context, h *hold, id string, lease time.Duration, _ time.Time) (bool, error) {
	reply, short, err := h.locker.runAcked(ctx, extendScript, []string{h.key}, []any{h.token, id, lease.Milliseconds()}, nil)
	if err != nil {
		return false, err
	}
	n, err := integer(reply)
	if err == nil && n == 1 && short != nil {
		return true, short // extended on the master alone
	}
	return n == 1, err
}
