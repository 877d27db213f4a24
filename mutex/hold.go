package mutex

import (
	"slices"
	"sync/atomic"
	"time"
)

// A hold is one owner's possession of a lock: one token, the root handle and
// every re-entry through Lock.Context. Its life (lease.go) is the lease's:
// when it ends, every open handle ends with it.
type hold struct {
	life   // mu guards the hold and its handles' phases and signals
	locker *Locker
	name   string
	names  // the keys of the lock and of its release records, the token
	// valueArg is value boxed once: the native SET NX's and unlock.lua's
	// argument.
	valueArg any
	fence    int64 // set before the hold is shared
	// adopted: the token came from the orphan memory (orphans.go); the
	// hold's release spends it (spent.go). Set before the hold is shared.
	adopted bool
	nextID  atomic.Uint64

	busy    int      // calls acting for the hold in Redis, releases aside (Lock.use)
	handles []*Lock  // open handles: the root and its re-entries
	one     [1]*Lock // handles' first backing array: no allocation for the root
}

// newHold returns the hold of n's token on name.
func newHold(l *Locker, name string, n names) *hold {
	return &hold{locker: l, name: name, names: n, valueArg: n.value}
}

// A root is a hold and its root handle, made together: one allocation for
// the common acquisition.
type root struct {
	h  hold
	lk Lock
}

// newRoot returns the root handle of a new hold of n's token on name, whose
// lock an attempt just obtained with fencing number fence; value is
// n.value, boxed.
func newRoot(l *Locker, name string, n names, value any, fence int64) *Lock {
	r := &root{h: hold{locker: l, name: name, names: n, valueArg: value, fence: fence}}
	r.lk.hold = &r.h
	return &r.lk
}

// lockKeys appends the keys of a lock script to keys: the lock's, the
// release records' (release scripts only) and the fencing counter's (with
// fencing only).
func lockKeys(keys []string, n *names, release bool) []string {
	keys = append(keys, n.key)
	if release {
		keys = append(keys, n.nkey, n.tkey)
	}
	if n.fkey != "" {
		keys = append(keys, n.fkey)
	}
	return keys
}

// add records a handle obtained by a script sent at start that left a lease of
// lease on the key.
func (h *hold) add(lk *Lock, start time.Time, lease time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		// The lease was declared lost while this re-entry was in flight: the
		// handle is born lost rather than silently reviving the hold.
		lk.endLocked(lost)
		return
	}
	if h.handles == nil {
		h.handles = h.one[:0]
	}
	h.handles = append(h.handles, lk)
	if d := leaseEnd(start, lease); d.After(h.deadline) {
		h.deadline = d
	}
}

// passOn hands the lock from its last handle lk to a local waiter without a
// round trip: the waiter gets a new handle on the same token, handle field and
// lease in Redis. It does so only while the lease surely lasts at least 90% of
// the waiter's own lease (so the waiter gets nearly what it asked for), and
// returns nil otherwise, when lk is not the last open handle, or when a call
// acts for the hold in Redis (busy): that call could act for the waiter's
// lock, which has the same token.
func (h *hold) passOn(lk *Lock, cfg lockConfig) *Lock {
	h.mu.Lock()
	if h.ended || h.busy > 0 || len(h.handles) != 1 || h.handles[0] != lk || time.Until(h.deadline) < cfg.ttl-cfg.ttl/10 {
		h.mu.Unlock()
		return nil
	}
	nh := &hold{locker: h.locker, name: h.name, names: h.names, valueArg: h.valueArg, adopted: h.adopted}
	nh.deadline = h.deadline
	nh.nextID.Store(h.nextID.Load()) // re-entries must not reuse a live handle's field
	nlk := &Lock{hold: nh, id: lk.id}
	nh.one[0] = nlk
	nh.handles = nh.one[:1]
	h.handles = slices.DeleteFunc(h.handles, func(x *Lock) bool { return x == lk })
	lk.endLocked(handedOver)
	h.endLocked(handedOver)
	h.mu.Unlock()
	if cfg.renew {
		nh.startRenew(nh, cfg.ttl)
	}
	return nlk
}

// enter marks the start of a re-entry of the hold (see Lock.use):
// ErrNotHeld when it has ended.
func (h *hold) enter() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.expireLocked(h) {
		return ErrNotHeld
	}
	h.busy++
	return nil
}

// hasEnded reports whether the hold has ended (released, handed over, lost).
func (h *hold) hasEnded() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended
}

// exit ends an enter.
func (h *hold) exit() {
	h.mu.Lock()
	h.busy--
	h.mu.Unlock()
}

// release closes one handle after Redis released it; last is true when the
// key was deleted (or handed on under another token): an adopted token is
// then spent.
func (h *hold) release(lk *Lock, last bool) {
	h.mu.Lock()
	h.handles = slices.DeleteFunc(h.handles, func(x *Lock) bool { return x == lk })
	lk.endLocked(released)
	if last {
		h.endLocked(released)
	}
	h.mu.Unlock()
	if last {
		h.locker.dep.spend(h)
	}
}

// end ends the hold and every open handle in phase p.
func (h *hold) end(p phase) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endLocked(p)
}

// lose ends every handle as lost: Redis reported the lock gone. While one of
// them is being released it does nothing: that release's reply from Redis
// tells how the hold ended (a release that ran before this call's script
// makes the lock "released", not "lost").
func (h *hold) lose() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, lk := range h.handles {
		if lk.phase == releasing {
			return
		}
	}
	h.endLocked(lost)
}

// endLocked ends the hold and every open handle in phase p.
func (h *hold) endLocked(p phase) {
	if !h.finishLocked() {
		return
	}
	for _, lk := range h.handles {
		lk.endLocked(p)
	}
	h.handles = nil
}
