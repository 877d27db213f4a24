package mutex

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
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

// A phase is where a handle is in its life. Only held and releasing are
// open. Every change of phase happens under its hold's mu, so racing calls
// on one handle are decided by one transition: the call that moves the
// handle from held to releasing is the one release that talks to Redis or
// to a waiter, and the others answer ErrNotHeld without either.
type phase uint8

const (
	held       phase = iota // open: any method may run
	releasing               // an Unlock or UnlockWith is under way; its error leaves the handle held
	released                // unlocked (Unlock, UnlockWith, or its hold released)
	handedOver              // passed to a waiter of this Locker, token and all
	lost                    // the lease ended, or Redis reported the lock gone
)

// cause is what Done's context reports for a handle that ended in p.
func (p phase) cause() error {
	if p == lost {
		return ErrLockLost
	}
	return ErrNotHeld
}

// A Lock is one handle on a held lock, returned by Locker.Lock, TryLock and
// TryLockWith. Its methods are safe for concurrent use: when they race, one
// Unlock or UnlockWith wins and the others return ErrNotHeld, and no method
// acts for a handle that another call has released or handed over. A nil
// *Lock is safe to Unlock (it returns ErrNotHeld), so `defer lk.Unlock(ctx)`
// never panics.
type Lock struct {
	hold *hold
	id   uint64

	// Guarded by hold.mu.
	lifeSignal         // the handle's phase, Done's channel and Context's contexts
	unsure     *unsure // a release of this handle may have run
}

// Name returns the name the lock was taken on ("" for a nil Lock).
func (lk *Lock) Name() string {
	if lk == nil {
		return ""
	}
	return lk.hold.name
}

// Fence returns the fencing number of this acquisition, or 0 when the Locker
// was made without WithFencing. A re-entrant handle shares its owner's number.
func (lk *Lock) Fence() int64 {
	if lk == nil {
		return 0
	}
	return lk.hold.fence
}

// Token returns the random token (128 bits, hex) of this acquisition. A
// re-entrant handle shares its owner's token.
func (lk *Lock) Token() string {
	if lk == nil {
		return ""
	}
	return lk.hold.token
}

// use marks the start of a call that acts for lk in Redis without ending it
// (Extend, Run, TTL, a re-entry): ErrNotHeld when lk is not held. While such
// a call runs, the hold is busy: a release of it goes through Redis, never
// hands the token to a local waiter, so that the call cannot act for the
// waiter's lock. Each use is ended by unuse.
func (lk *Lock) use() error {
	if lk == nil {
		return ErrNotHeld
	}
	h := lk.hold
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.endedLocked(h, &lk.lifeSignal) != nil || lk.phase != held {
		return ErrNotHeld
	}
	h.busy++
	return nil
}

// unuse ends a use of lk.
func (lk *Lock) unuse() {
	lk.hold.mu.Lock()
	lk.hold.busy--
	lk.hold.mu.Unlock()
}

// beginRelease moves lk from held to releasing: the one transition that
// decides which of racing releases runs. It returns what the release needs
// to know of the handle then.
func (lk *Lock) beginRelease() (again *unsure, last, renews bool, err error) {
	h := lk.hold
	h.mu.Lock()
	defer h.mu.Unlock()
	if lk.phase != held {
		return nil, false, false, ErrNotHeld
	}
	lk.phase = releasing
	last = len(h.handles) == 1 && h.handles[0] == lk
	return lk.unsure, last, h.renew != nil, nil
}

// abortRelease moves lk back from releasing to held after a release that
// failed: the handle stays open, to be released again (see Unlock).
func (lk *Lock) abortRelease() {
	lk.hold.mu.Lock()
	defer lk.hold.mu.Unlock()
	if lk.phase == releasing {
		lk.phase = held
	}
}

// closedChan is what Done of a nil Lock returns.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done returns a channel that is closed when this handle ends: after Unlock
// (before it returns), or when the lock is lost (its lease passed on the
// client's clock without an Extend, or Redis reported it gone). A call made
// once the lease has passed returns a closed channel. The first call starts
// a timer at the end of the lease, which closes a channel taken earlier: in
// a process paused past the lease, that timer runs only after the process
// resumes, so a holder about to act checks Deadline, or calls Done again.
// A lock whose Done is never called costs no timer.
func (lk *Lock) Done() <-chan struct{} {
	if lk == nil {
		return closedChan
	}
	return lk.hold.done(lk.hold, &lk.lifeSignal)
}

// Deadline returns the time until which this handle surely holds the lock,
// on the client's clock: the end of the lease Redis confirmed (by the
// acquisition or the last Extend, or a renewal), less the drift margin. ok
// is false once the handle has ended, as it has when that time has passed.
// Check it right before an action that must run under the lock: a deadline
// in the past, or too near for the action, means the lock may be gone.
func (lk *Lock) Deadline() (deadline time.Time, ok bool) {
	if lk == nil {
		return time.Time{}, false
	}
	return lk.hold.leaseDeadline(lk.hold, &lk.lifeSignal)
}

// Context returns a context derived from parent that carries the ownership of
// this lock, for re-entry (see TryLock), and is cancelled when the handle ends:
// with cause ErrLockLost when the lock was lost, ErrNotHeld after Unlock
// (read it with context.Cause). Work that must stop when the lock is lost
// should run under this context.
func (lk *Lock) Context(parent context.Context) context.Context {
	if lk == nil {
		ctx, cancel := context.WithCancelCause(parent)
		cancel(ErrNotHeld)
		return ctx
	}
	next, _ := parent.Value(ownerKey{}).(*owner)
	ctx := context.WithValue(parent, ownerKey{}, &owner{hold: lk.hold, next: next})
	return lk.hold.context(lk.hold, &lk.lifeSignal, ctx)
}

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
	// adopted: the token came from the orphan memory (retrysafety.go); the
	// hold's release spends it (retrysafety.go). Set before the hold is shared.
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
