package mutex

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// closedChan is what Done of a nil Lock returns.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// unlockTimeout bounds an Unlock, which runs detached from its ctx's
// cancellation so that a lock is released even when the caller gave up.
const unlockTimeout = 2 * time.Second

// A Lock is one handle on a held lock, returned by Locker.Lock, TryLock and
// TryLockWith. Its methods are safe for concurrent use. A nil *Lock is safe
// to Unlock (it returns ErrNotHeld), so `defer lk.Unlock(ctx)` never panics.
type Lock struct {
	hold *hold
	id   uint64

	// Guarded by hold.mu.
	cause  error // why the handle ended; nil while it is open
	life   context.Context
	cancel context.CancelCauseFunc
	unsure *unsure // a release of this handle may have run
}

// unsure is a release of a handle that failed with an unknown outcome: it
// may have run in Redis. The handle's next release makes the very same call
// (the same next owner, or none; never a local hand-over, since the lock may
// be gone from Redis), so that the first one's record answers it.
type unsure struct {
	next  *hold         // the next owner that release named, nil for none
	lease time.Duration // its lease
	start time.Time     // when that release was sent: its lease began after
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

func (lk *Lock) open() bool {
	lk.hold.mu.Lock()
	defer lk.hold.mu.Unlock()
	return lk.cause == nil
}

func (lk *Lock) args() []any {
	return []any{lk.hold.token, argID(lk.id)}
}

// Unlock releases this handle; releasing the last handle of a lock deletes it,
// or passes the lock to a goroutine of this Locker waiting for it (see
// Locker). A cancellation of ctx does not stop it, but its deadline bounds
// it; with a ctx that has ended already, or one that can be cancelled but has
// no deadline, it still runs, bounded by 2 s of its own. It returns ErrNotHeld when the handle was unlocked already or the
// lock is gone (its lease ended, another owner has it): it never touches
// another owner's lock. A hand-over without a round trip cannot see a lock
// deleted in Redis before its lease ended; the waiter's own Unlock or
// UnlockWith will. After a Redis error the handle stays open and Unlock can
// be called again: if the first call did release it (its reply was lost),
// the second reports success from the release's record (see the package
// documentation), within 10 s. The second makes the first one's call again:
// it never passes the lock to a local waiter without Redis (the lock may be
// gone from Redis already), and a hand-over the first made in Redis goes to
// the waiter now first in line, or is released.
func (lk *Lock) Unlock(ctx context.Context) error {
	_, err := lk.unlock(ctx, nil)
	return err
}

// UnlockWith runs call.Fragment only if this handle still holds the lock,
// and releases the handle in the same script: a commit that cannot land after
// the lease lapsed. It returns the fragment's result, or ErrNotHeld when the
// handle no longer holds the lock: this call did not run the fragment. After
// a Redis error (a timeout, a lost reply) the outcome is unknown; the same
// call made again within 10 s reports what happened: the fragment's result
// if the first run committed (or ErrResultUnknown when that result was a
// table), or a fresh run if it did not. go-redis makes that second call by
// itself when a reply is lost. See Fragment.
func (lk *Lock) UnlockWith(ctx context.Context, call Call) (any, error) {
	if err := call.check(); err != nil {
		return nil, err
	}
	if lk != nil {
		if err := lk.hold.locker.unsupported("a Fragment"); err != nil {
			return nil, err
		}
	}
	return lk.unlock(ctx, &call)
}

func (lk *Lock) unlock(ctx context.Context, call *Call) (any, error) {
	if lk == nil {
		return nil, ErrNotHeld
	}
	h, l := lk.hold, lk.hold.locker
	h.mu.Lock()
	open, again, renews := lk.cause == nil, lk.unsure, h.renew != nil
	last := len(h.handles) == 1 && h.handles[0] == lk
	h.mu.Unlock()
	if !open {
		return nil, ErrNotHeld
	}
	ctx, cancel := detach(ctx)
	defer cancel()

	// Closing the last local handle: stop renewal first (no renewal runs
	// after Unlock returns), and offer the lock to the next local waiter.
	var next *waiter
	var nh *hold
	var lease time.Duration
	if last {
		if renews {
			h.stopRenew()
		}
		switch {
		case l.q != nil: // a quorum hands nothing over: its release is not one script
		case again == nil:
			if next = l.nextWaiter(h.name); next != nil {
				nh, lease = newHold(l, h.name, l.names(h.name)), next.cfg.ttl
			}
		case again.next != nil:
			// The same hand-over as the release that may have run; to the
			// waiter now first in line, if any.
			nh, lease = again.next, again.lease
			next = l.nextWaiter(h.name)
		}
	}
	nextToken, nextLease := any(""), any(0)
	if nh != nil {
		nextToken, nextLease = nh.token, lease.Milliseconds()
	}
	if l.q != nil {
		return nil, lk.unlockQuorum(ctx)
	}
	if next != nil && call == nil && l.fenceTTL == 0 && again == nil {
		if nlk := h.passOn(lk, next.cfg); nlk != nil {
			l.handedOver(h.name, next, nlk)
			return nil, nil
		}
	}
	script := releaseScript
	if call != nil {
		script = call.Fragment.release
	}
	seq, st := l.releases.begin()
	if call == nil && nh == nil && last && lk.id == 0 && l.fenceTTL == 0 {
		// The common case, in its short script (unlock.lua); any other
		// shape, or a lock not held, goes on to release.lua.
		reply, err := l.run(ctx, unlockScript, []string{h.key, h.nkey, h.tkey}, st.unlockArgs(h.valueArg, h.token), nil)
		switch {
		case err != nil:
			l.releases.end(seq, false)
			lk.unsureOf(err, nil, 0, time.Time{})
			return nil, fmt.Errorf("mutex: unlock %q: %w", h.name, err)
		case reply == any(int64(0)):
			l.releases.end(seq, true)
			l.scripted.Store(true)
			h.release(lk, true)
			l.released(h.name)
			return nil, nil
		}
	}
	owner, sseq, smark := st.releaseArgs()
	keys, args := scriptCall(call, &h.names, true, h.token, argID(lk.id), nextToken, nextLease, l.fenceMS, owner, sseq, smark)
	start := time.Now()
	if again != nil && again.next != nil {
		start = again.start // the hand-over may date from then
	}
	var late func(any, error)
	if nh != nil {
		// The release may have handed the lock to nh in Redis: when its
		// reply comes after the caller left, nobody will hold nh.
		late = l.orphanOf(nh)
	}
	// A hand-over or a fragment's write waits for the replicas (WithReplicaAck).
	var reply any
	var short, err error
	if nh != nil || call != nil {
		reply, short, err = l.runAcked(ctx, script, keys, args, late)
	} else {
		reply, err = l.run(ctx, script, keys, args, late)
	}
	l.releases.end(seq, err == nil)
	var r [3]int64
	var rest []any
	if err == nil {
		l.scripted.Store(true)
		r, rest, err = ints(reply, 2)
	}
	if err != nil {
		if next != nil {
			l.handedOver(h.name, next, nil)
		}
		lk.unsureOf(err, nh, lease, start)
		return nil, fmt.Errorf("mutex: unlock %q: %w", h.name, err)
	}
	left := r[0]
	if left < 0 {
		if next != nil {
			l.handedOver(h.name, next, nil)
		}
		h.end(ErrLockLost)
		return nil, ErrNotHeld
	}
	h.release(lk, left == 0)
	if short != nil && nh != nil && left == 0 {
		// Handed over on the master alone: undone, and the waiter (if it
		// is still there) tries again, waiting for the replicas itself.
		l.releaseRoot(ctx, nh)
		if next != nil {
			l.handedOver(h.name, next, nil)
		}
		next, nh = nil, nil // the switch below reports the release
		if call == nil {
			short = nil // the release itself stands, and needs no replica
		}
	}
	switch {
	case next != nil && left == 0:
		nh.fence = r[1]
		nlk := &Lock{hold: nh}
		nh.add(nlk, start, lease)
		if next.cfg.renew {
			nh.startRenew(next.cfg.ttl)
		}
		l.handedOver(h.name, next, nlk)
	case next != nil:
		l.handedOver(h.name, next, nil) // Redis still counts open handles
	case left == 0 && nh != nil:
		// Handed to nh by a release that may have run before, for a
		// waiter that has gone: nobody takes it. (Within this Unlock's
		// deadline; if that passes, nh's lease ends it.)
		l.releaseRoot(ctx, nh)
		l.released(h.name)
	case left == 0:
		l.released(h.name)
	}
	var res any
	if len(rest) > 0 {
		res = rest[0]
	}
	if len(rest) > 1 && rest[1] == any(int64(2)) && call != nil {
		return nil, ErrResultUnknown // a replay: the fragment ran, its table result was not kept
	}
	if short != nil {
		return res, fmt.Errorf("mutex: unlock %q: %w", h.name, short)
	}
	return res, nil
}

// unsureOf records a release of lk that failed with err, if its outcome is
// unknown (it may have run): the first such release, whose call the next
// release repeats (see unsure).
func (lk *Lock) unsureOf(err error, next *hold, lease time.Duration, start time.Time) {
	if !unknownOutcome(err) {
		return
	}
	lk.hold.mu.Lock()
	defer lk.hold.mu.Unlock()
	if lk.unsure == nil {
		lk.unsure = &unsure{next: next, lease: lease, start: start}
	}
}

// dropWait is how long a call waits for the release of a lock it obtained
// for a caller that has left (drop) before it returns all the same.
const dropWait = 100 * time.Millisecond

// drop releases a handle that a call obtained for its caller but does not
// return (its ctx ended meanwhile), so that the lock is not left held by a
// handle nobody has: bounded by unlockTimeout, and waited for dropWait at
// most, so that the caller returns by its deadline plus that margin even on
// a hung server. In the common case the lock is free again when the caller
// returns.
func (lk *Lock) drop() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
		defer cancel()
		_ = lk.Unlock(ctx)
	}()
	t := time.NewTimer(dropWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// detach returns the context of a release: one that a cancellation of ctx
// does not stop, so that a lock is released even when the caller gave up,
// but that keeps ctx's deadline, so that the call returns by it; bounded by
// unlockTimeout when ctx has no deadline or has ended already.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Done() == nil {
		return ctx, func() {}
	}
	d, ok := ctx.Deadline()
	if !ok || ctx.Err() != nil {
		d = time.Now().Add(unlockTimeout)
	}
	return context.WithDeadline(context.WithoutCancel(ctx), d)
}

// Run runs call.Fragment only while this handle holds the lock, without
// releasing it, and returns its result; ErrNotHeld (not run) when the handle
// no longer holds the lock; ErrDeclined with the result when call.Fragment
// is a gate that declined (the lock stays held). Unlike a release, Run keeps
// no record: a run that go-redis repeats after a lost reply runs the
// fragment twice, so give Run fragments that read, or writes that can run
// twice (a SET, not an INCR).
func (lk *Lock) Run(ctx context.Context, call Call) (any, error) {
	if err := call.check(); err != nil {
		return nil, err
	}
	if lk == nil || !lk.open() {
		return nil, ErrNotHeld
	}
	if err := lk.hold.locker.unsupported("a Fragment"); err != nil {
		return nil, err
	}
	keys, args := scriptCall(&call, &names{key: lk.hold.key}, false, lk.hold.token, argID(lk.id))
	reply, short, err := lk.hold.locker.runAcked(ctx, call.Fragment.held, keys, args, nil)
	if err != nil {
		return nil, fmt.Errorf("mutex: run %q: %w", lk.hold.name, err)
	}
	r, rest, err := ints(reply, 1)
	if err != nil {
		return nil, err
	}
	var res any
	if len(rest) > 0 {
		res = rest[0]
	}
	switch r[0] {
	case 0:
		lk.hold.end(ErrLockLost)
		return nil, ErrNotHeld
	case declinedReply:
		return rest, ErrDeclined // the gate's table: its result is all of it
	}
	if short != nil {
		return res, fmt.Errorf("mutex: run %q: %w", lk.hold.name, short)
	}
	return res, nil
}

// Extend sets the remaining lease of the lock to ttl (which may shorten it).
// It returns ErrNotHeld when the lock is no longer held by this handle.
func (lk *Lock) Extend(ctx context.Context, ttl time.Duration) error {
	if lk == nil || !lk.open() {
		return ErrNotHeld
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: lease %v: want at least 1ms", ErrInvalid, ttl)
	}
	start := time.Now()
	held, err := lk.hold.extend(ctx, handleID(lk.id), ttl, start)
	if err != nil {
		return fmt.Errorf("mutex: extend %q: %w", lk.hold.name, err)
	}
	if !held {
		lk.hold.end(ErrLockLost)
		return ErrNotHeld
	}
	lk.hold.setLease(start, ttl)
	return nil
}

// TTL returns the remaining lease of the lock as Redis sees it, or ErrNotHeld.
func (lk *Lock) TTL(ctx context.Context) (time.Duration, error) {
	if lk == nil || !lk.open() {
		return 0, ErrNotHeld
	}
	if q := lk.hold.locker.q; q != nil {
		d, err := q.pttl(ctx, lk.hold, handleID(lk.id))
		if errors.Is(err, ErrNotHeld) {
			lk.hold.end(ErrLockLost)
			return 0, ErrNotHeld
		}
		if err != nil {
			return 0, fmt.Errorf("mutex: ttl %q: %w", lk.hold.name, err)
		}
		return d, nil
	}
	reply, err := lk.hold.locker.run(ctx, pttlScript, []string{lk.hold.key}, lk.args(), nil)
	if err != nil {
		return 0, fmt.Errorf("mutex: ttl %q: %w", lk.hold.name, err)
	}
	ms, err := integer(reply)
	if err != nil {
		return 0, err
	}
	if ms == -3 {
		lk.hold.end(ErrLockLost)
		return 0, ErrNotHeld
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Done returns a channel that is closed when this handle ends: after Unlock,
// or when the lock is lost (its lease passed on the client's clock without an
// Extend, or Redis reported it gone). The first call starts a timer at the end
// of the lease; a lock whose Done is never called costs no timer.
func (lk *Lock) Done() <-chan struct{} {
	if lk == nil {
		return closedChan
	}
	lk.hold.mu.Lock()
	defer lk.hold.mu.Unlock()
	return lk.lifeLocked().Done()
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
	ctx, cancel := context.WithCancelCause(ctx)
	lk.hold.mu.Lock()
	life := lk.lifeLocked()
	lk.hold.mu.Unlock()
	if life.Err() != nil { // ended already: cancelled before it is returned
		cancel(context.Cause(life))
		return ctx
	}
	stop := context.AfterFunc(life, func() { cancel(context.Cause(life)) })
	context.AfterFunc(ctx, func() { stop() }) // forget ctx once it ends on its own
	return ctx
}
