package mutex

import (
	"context"
	"time"
)

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
