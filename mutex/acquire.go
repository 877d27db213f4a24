package mutex

import (
	"context"
	"errors"
	"math"
	mathrand "math/rand/v2"
	"time"
)

// TryLock makes one attempt to acquire the lock on name. It returns ErrLocked
// when another owner holds it.
//
// If ctx carries ownership of name (from Lock.Context of a lock of this
// Locker), TryLock re-enters that lock instead: the hold count in Redis goes
// up by one and the returned handle must be unlocked too; it returns
// ErrNotHeld if the owning lock is gone. Without such a context, locking a
// name twice fails like any other contention, even in one goroutine: Go has
// no goroutine identity, so ownership is explicit.
func (l *Locker) TryLock(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	if ctx == nil {
		return nil, ErrNilContext
	}
	cfg, err := l.config(name, opts)
	if err != nil {
		return nil, err
	}
	lk, _, _, err := l.attempt(ctx, name, cfg, nil, tryOnce)
	return lk, err
}

// TryLockWith is TryLock that also runs call.Fragment in the same script as
// the acquire attempt, and returns its result whether or not the lock was
// obtained (with ErrLocked when it was not). See Fragment.
func (l *Locker) TryLockWith(ctx context.Context, name string, call Call, opts ...Option) (*Lock, any, error) {
	if ctx == nil {
		return nil, nil, ErrNilContext
	}
	if err := call.check(); err != nil {
		return nil, nil, err
	}
	if err := l.unsupported("a Fragment"); err != nil {
		return nil, nil, err
	}
	cfg, err := l.config(name, opts)
	if err != nil {
		return nil, nil, err
	}
	lk, _, res, err := l.attempt(ctx, name, cfg, &call, tryOnce)
	if errors.Is(err, ErrDeclined) {
		l.declined(name) // waiters of this Locker for name likely hear "no" too
	}
	return lk, res, err
}

// Lock acquires the lock on name, waiting as long as ctx allows. When ctx
// ends first it returns an error matching both ErrNotObtained and ctx.Err(),
// without waiting for the next attempt. Redis errors end the wait at once.
// An attempt cut short by ctx has an unknown outcome: if Redis runs it, the
// lock stays under this call's token, held by nobody, until its lease ends
// or the next attempt on name of this Locker adopts it (see PROTOCOL.md).
// A Redis that cannot be reached (ErrUnreachable) ends the call at once.
// Re-entry through ctx works as in TryLock and never waits.
//
// While it waits, the call polls Redis only if it heads this Locker's queue
// for the name, at a jittered retry interval, or just after the holder's lease
// ends if that is sooner; a release notification or a local hand-over ends the
// wait early (see Locker).
func (l *Locker) Lock(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	if ctx == nil {
		return nil, ErrNilContext
	}
	cfg, err := l.config(name, opts)
	if err != nil {
		return nil, err
	}
	if ownerOf(ctx, l, name) != nil {
		lk, _, _, err := l.attempt(ctx, name, cfg, nil, tryOnce)
		return lk, err
	}
	if ctx.Err() != nil {
		return nil, errors.Join(ErrNotObtained, ctx.Err())
	}
	primed, pttl := false, time.Duration(-1)
	if !l.queued(name) {
		// Nobody of this Locker waits for name: one attempt before queueing,
		// which the uncontended case needs no queue for (a native SET NX PX
		// when it can be). If it finds the lock held, it is the queue's
		// head's first attempt (followed).
		lk, p, _, err := l.attempt(ctx, name, cfg, nil, first)
		switch {
		case err == nil:
			return lk, nil
		case ctx.Err() != nil:
			return nil, errors.Join(ErrNotObtained, ctx.Err())
		case !errors.Is(err, ErrLocked):
			return nil, err
		}
		primed, pttl = true, p
	}
	o := l.wait(ctx, name, cfg, nil, primed, pttl)
	return o.lk, o.err
}

// LockWith is Lock that runs call.Fragment with every acquire attempt, and
// returns its result as read with the attempt that obtained the lock (or, if
// a local holder handed the lock over, as read under the lock right after).
// With a gate (NewGate) that declines, it stops waiting and returns
// ErrDeclined and the gate's result, holding no lock.
func (l *Locker) LockWith(ctx context.Context, name string, call Call, opts ...Option) (*Lock, any, error) {
	if ctx == nil {
		return nil, nil, ErrNilContext
	}
	if err := call.check(); err != nil {
		return nil, nil, err
	}
	if err := l.unsupported("a Fragment"); err != nil {
		return nil, nil, err
	}
	cfg, err := l.config(name, opts)
	if err != nil {
		return nil, nil, err
	}
	if ownerOf(ctx, l, name) != nil {
		lk, _, res, err := l.attempt(ctx, name, cfg, &call, tryOnce)
		return lk, res, err
	}
	if ctx.Err() != nil {
		return nil, nil, errors.Join(ErrNotObtained, ctx.Err())
	}
	o := l.wait(ctx, name, cfg, &call, false, -1)
	if !o.handed {
		return o.lk, o.res, o.err
	}
	// Handed over by a local holder: the fragment has not run yet.
	lk := o.lk
	res, err := lk.Run(ctx, call)
	if errors.Is(err, ErrDeclined) {
		l.declined(name)
	}
	if err != nil {
		lk.drop()
		if ctx.Err() != nil {
			err = errors.Join(ErrNotObtained, ctx.Err())
		}
		return nil, res, err
	}
	return lk, res, nil
}

// nextWait is the pause before the next attempt: a jittered retry interval,
// or just past the end of the holder's lease when that comes sooner.
func (l *Locker) nextWait(pttl time.Duration) time.Duration {
	// retry/2 + [0, retry), saturated: a retry interval of centuries must
	// not wrap to a negative wait (which would mean "no timer").
	half, jitter := l.retry/2, time.Duration(mathrand.Int64N(int64(l.retry)))
	wait := time.Duration(math.MaxInt64)
	if jitter <= math.MaxInt64-half {
		wait = half + jitter
	}
	if pttl >= 0 && pttl+time.Millisecond < wait {
		wait = pttl + time.Millisecond
	}
	return wait
}
