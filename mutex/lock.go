package mutex

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"
)

// Run runs call.Fragment while this handle holds the lock and returns its
// result, or ErrNotHeld (not run), or ErrDeclined with a gate's result. A run
// may be repeated after a lost reply: give it reads or idempotent writes.
func (lk *Lock) Run(ctx context.Context, call Call) (any, error) {
	if err := lk.use(ctx, call.check(lk.dep())); err != nil {
		return nil, err
	}
	defer lk.hold.exit()
	h := lk.hold
	keys, args := scriptCall(&call, &names{key: h.key}, false, h.token, argID(lk.id))
	reply, short, err := h.locker.runWithAck(ctx, call.Fragment.held, keys, args, false, false, nil)
	if err != nil {
		return nil, opErr("run", h.name, err)
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
	return resultOf(rest), opErr("run", h.name, short)
}

// Extend sets the remaining lease of the lock to ttl, which may shorten it.
// It returns ErrNotHeld when this handle no longer holds the lock.
func (lk *Lock) Extend(ctx context.Context, ttl time.Duration) error {
	if err := lk.use(ctx, checkDuration("lease", ttl)); err != nil {
		return err
	}
	defer lk.hold.exit()
	start := time.Now()
	ok, err := lk.hold.locker.dep.extend(ctx, lk.hold, argID(lk.id), ttl, start)
	if err != nil {
		return opErr("extend", lk.hold.name, err)
	}
	if !ok {
		lk.hold.lose()
		return ErrNotHeld
	}
	lk.hold.setLease(start, ttl)
	return nil
}

// TTL returns the remaining lease of the lock as Redis sees it, or ErrNotHeld.
func (lk *Lock) TTL(ctx context.Context) (time.Duration, error) {
	if err := lk.use(ctx, nil); err != nil {
		return 0, err
	}
	defer lk.hold.exit()
	d, err := lk.hold.locker.dep.pttl(ctx, lk)
	switch {
	case errors.Is(err, ErrNotHeld):
		lk.hold.lose()
		return 0, ErrNotHeld
	case err != nil:
		return 0, opErr("ttl", lk.hold.name, err)
	}
	return d, nil
}

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

func (single) extend(ctx context.Context, h *hold, id any, lease time.Duration, _ time.Time) (bool, error) {
	args := []any{h.token, id, lease.Milliseconds()}
	reply, short, err := h.locker.runWithAck(ctx, extendScript, []string{h.key}, args, false, false, nil)
	if err != nil {
		return false, err
	}
	n, err := integer(reply)
	if err == nil && n == 1 && short != nil {
		return true, short // extended on the master alone
	}
	return n == 1, err
}

// A phase is where a handle is in its life, changed under its hold's mu
// (PROTOCOL.md, "A handle is a state machine").
type phase uint8

const (
	held       phase = iota // open: any method may run
	releasing               // an Unlock or UnlockWith is under way; its error leaves the handle held
	released                // unlocked (Unlock, UnlockWith, or its hold released)
	handedOver              // passed to a waiter of this Locker, token and all
	lost                    // the lease ended, or Redis reported the lock gone
)

func (p phase) cause() error {
	if p == lost {
		return ErrLockLost
	}
	return ErrNotHeld
}

// A Lock is one handle on a held lock. Its methods are safe for concurrent
// use: of racing releases one wins and the others return ErrNotHeld. A nil
// *Lock's Unlock returns ErrNotHeld, so `defer lk.Unlock(ctx)` never panics.
type Lock struct {
	hold *hold
	id   uint64

	// Guarded by hold.mu.
	lifeSignal          // the handle's phase, Done's channel and Context's contexts
	unsure     *handOff // a release of this handle may have run
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

// Token returns the random token of this acquisition, shared by re-entrant
// handles.
func (lk *Lock) Token() string {
	if lk == nil {
		return ""
	}
	return lk.hold.token
}

// use marks the hold busy for a call that acts for lk in Redis (Extend, Run,
// TTL) until hold.exit: a busy hold is never handed over locally, which keeps
// the token, so the call cannot act for the waiter's lock. A nil ctx, then
// bad (the call's own check of its arguments), come first.
func (lk *Lock) use(ctx context.Context, bad error) error {
	switch {
	case ctx == nil:
		return ErrNilContext
	case bad != nil:
		return bad
	case lk == nil:
		return ErrNotHeld
	}
	return lk.hold.enter(&lk.lifeSignal)
}

// dep is the deployment of lk's Locker; a nil Lock, on none, refuses nothing.
func (lk *Lock) dep() deployment {
	if lk == nil {
		return single{}
	}
	return lk.hold.locker.dep
}

// beginRelease moves lk from held to releasing: one of racing releases wins.
func (lk *Lock) beginRelease() (again *handOff, last bool, err error) {
	h := lk.hold
	h.mu.Lock()
	defer h.mu.Unlock()
	if lk.phase != held {
		return nil, false, ErrNotHeld
	}
	lk.phase = releasing
	last = len(h.handles) == 1 && h.handles[0] == lk
	return lk.unsure, last, nil
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done returns a channel closed when this handle ends: by Unlock, before it
// returns, or when the lock is lost (lease passed, or gone in Redis). After a pause past the lease it closes only once the
// process resumes: check Deadline right before acting.
func (lk *Lock) Done() <-chan struct{} {
	if lk == nil {
		return closedChan
	}
	return lk.hold.done(lk.hold, &lk.lifeSignal)
}

// Deadline returns the time until which this handle surely holds the lock,
// on the client's clock: the end of the lease Redis last confirmed, less the
// drift margin. ok is false once the handle has ended.
func (lk *Lock) Deadline() (deadline time.Time, ok bool) {
	if lk == nil {
		return time.Time{}, false
	}
	return lk.hold.leaseDeadline(lk.hold, &lk.lifeSignal)
}

// Context returns a context derived from parent that carries this lock for
// re-entry (see TryLock) and is cancelled when the handle ends, with cause
// ErrLockLost when the lock was lost and ErrNotHeld after Unlock.
func (lk *Lock) Context(parent context.Context) context.Context {
	if lk == nil {
		return new(lifeSignal).deriveLocked(nil, parent, ErrNotHeld) // ended: uses neither the signal nor a mutex
	}
	next, _ := parent.Value(ownerKey{}).(*owner)
	ctx := context.WithValue(parent, ownerKey{}, &owner{hold: lk.hold, next: next})
	return lk.hold.context(lk.hold, &lk.lifeSignal, ctx)
}

// A hold is one owner's possession of a lock: one token, the root handle and
// its re-entries. When its life (lease.go) ends, every open handle ends.
type hold struct {
	life     // mu guards the hold and its handles' phases and signals
	locker   *Locker
	name     string
	names          // the keys of the lock and of its release records, the token
	valueArg any   // value boxed once, for SET NX and unlock.lua
	fence    int64 // set before the hold is shared
	adopted  bool  // the token came from the orphan memory (retrysafety.go); set before sharing
	nextID   atomic.Uint64

	busy    int      // calls acting for the hold in Redis, releases aside (Lock.use)
	handles []*Lock  // open handles: the root and its re-entries
	one     [1]*Lock // handles' first backing array: no allocation for the root
}

func newHold(l *Locker, name string, n names) *hold {
	return &hold{locker: l, name: name, names: n, valueArg: n.value}
}

// add records a handle obtained by a script sent at start.
func (h *hold) add(lk *Lock, start time.Time, lease time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		// Lost while this re-entry was in flight: born lost, not reviving it.
		lk.endLocked(lost)
		return
	}
	if h.handles == nil {
		h.handles = h.one[:0]
	}
	h.handles = append(h.handles, lk)
	if leaseEnd(start, lease).After(h.deadline()) {
		h.sent, h.lease = start, lease
	}
}

// passOn hands the lock from its last handle lk to a local waiter without a
// round trip, on the same token and lease, or returns nil when it may not
// (PROTOCOL.md, "Contention"; Lock.use).
func (h *hold) passOn(lk *Lock, cfg lockConfig) *Lock {
	h.mu.Lock()
	if h.ended || h.busy > 0 || len(h.handles) != 1 || h.handles[0] != lk || time.Until(h.deadline()) < cfg.ttl-cfg.ttl/10 {
		h.mu.Unlock()
		return nil
	}
	nlk := newRoot(h.locker, h.name, h.names, h.valueArg, 0, h.adopted, h.sent, h.lease)
	nlk.id = lk.id
	nlk.hold.nextID.Store(h.nextID.Load()) // re-entries must not reuse a live handle's field
	h.handles = slices.DeleteFunc(h.handles, func(x *Lock) bool { return x == lk })
	lk.endLocked(handedOver)
	h.endLocked(handedOver)
	h.mu.Unlock()
	return nlk
}

// enter marks the hold busy for a call of the handle s (Lock.use) or for a
// re-entry (s nil), or returns ErrNotHeld.
func (h *hold) enter(s *lifeSignal) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.expireLocked(h) || (s != nil && s.phase != held) {
		return ErrNotHeld
	}
	h.busy++
	return nil
}

func (h *hold) hasEnded() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended
}

func (h *hold) exit() {
	h.mu.Lock()
	h.busy--
	h.mu.Unlock()
}

// release closes one handle after Redis released it; last: the lock was
// deleted or handed on, and an adopted token is spent.
func (h *hold) release(lk *Lock, last bool) {
	h.mu.Lock()
	h.handles = slices.DeleteFunc(h.handles, func(x *Lock) bool { return x == lk })
	lk.endLocked(released)
	if !last {
		h.mu.Unlock()
		return
	}
	h.endLocked(released)
	h.mu.Unlock()
	h.locker.dep.spend(h)
}

// lose ends every handle as lost: Redis reported the lock gone. While one is
// being released it does nothing: that release's reply tells how it ended.
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

func (h *hold) endLocked(p phase) {
	if !h.finishLocked() {
		return
	}
	for _, lk := range h.handles {
		lk.endLocked(p)
	}
	h.handles = nil
}
