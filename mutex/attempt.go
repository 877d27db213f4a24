package mutex

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// An attemptMode says what one acquire attempt of a fresh token is for.
type attemptMode uint8

const (
	// tryOnce is TryLock's attempt: a native SET NX PX GET when it can be.
	tryOnce attemptMode = iota
	// first is Lock's first attempt: a native SET NX PX when it can be;
	// when that finds the lock held, it goes on as the queue's head's first
	// attempt (the script, under the same token, marking the lock).
	first
	// poll is a waiting head's attempt: the script, which reads the
	// holder's lease.
	poll
	// pollMarked is poll that also marks the held lock, so that its
	// release publishes a notification.
	pollMarked
)

// attempt makes one acquire attempt on name: a re-entry when ctx carries
// ownership of name, a fresh token's attempt otherwise. On contention it
// returns ErrLocked and the holder's remaining lease (negative when
// unknown).
func (l *Locker) attempt(ctx context.Context, name string, cfg lockConfig, call *Call, mode attemptMode) (*Lock, time.Duration, any, error) {
	if h := ownerOf(ctx, l, name); h != nil {
		return l.reenter(ctx, h, cfg, call)
	}
	return l.take(ctx, name, cfg, call, mode)
}

// take makes one attempt to acquire name under a new token, or under the
// token of an earlier attempt whose outcome is unknown (orphans.go). When
// it finds the lock held under a token this Locker has spent (spent.go), it
// deletes that lock and makes the attempt once more.
func (l *Locker) take(ctx context.Context, name string, cfg lockConfig, call *Call, mode attemptMode) (*Lock, time.Duration, any, error) {
	lk, pttl, res, err := l.takeToken(ctx, name, cfg, call, mode)
	if err == ErrLocked && l.clearSpent(ctx, name) {
		return l.takeToken(ctx, name, cfg, call, mode)
	}
	return lk, pttl, res, err
}

// takeToken is one attempt of take. The hold is made only once the lock is
// obtained: a denial or a failed attempt needs none.
func (l *Locker) takeToken(ctx context.Context, name string, cfg lockConfig, call *Call, mode attemptMode) (*Lock, time.Duration, any, error) {
	n, adopting := l.orphans.take(name)
	if adopting {
		mode = mode.scripted(l.canNotify())
	} else {
		n = l.names(name)
	}
	// Boxed once, the SET's argument and the hold's; after the attempt when
	// it runs a fragment (no SET): a declined gate, or one refused, needs
	// none.
	var value any
	if call == nil {
		value = n.value
	}
	start := time.Now()
	r, res, err := l.takeOnce(ctx, name, &n, value, cfg, call, mode, start)
	switch {
	case err != nil:
		l.remember(name, n, adopting, err)
		return nil, -1, nil, fmt.Errorf("mutex: acquire %q: %w", name, err)
	case r[0] == declinedReply:
		l.remember(name, n, adopting, nil)
		return nil, -1, res, ErrDeclined
	case r[0] != 1:
		l.remember(name, n, adopting, nil)
		return nil, time.Duration(r[1]) * time.Millisecond, res, ErrLocked
	}
	if value == nil {
		value = n.value
	}
	lk := newRoot(l, name, n, value, r[2])
	lk.hold.adopted = adopting
	lk.hold.add(lk, start, time.Duration(r[1])*time.Millisecond)
	if cfg.renew {
		lk.hold.startRenew(lk.hold, cfg.ttl)
	}
	return lk, -1, res, nil
}

// remember keeps n, the names of an attempt on name that got no lock, for
// the next attempt (orphans.go): when the attempt used a remembered token
// (adopting), or failed with err of unknown outcome (it may yet run) on a
// client that honours deadlines; there a reply that comes after its caller
// left at a cancellation (a hand-off, ctxcall) releases what it took only
// if it takes the token back first (mayUndo). On another client, an
// abandoned attempt's late reply releases what it took (undoLate), as the
// memory would not know when. A refused connection sent nothing: nothing
// to remember.
func (l *Locker) remember(name string, n names, adopting bool, err error) {
	if adopting || (l.honours && unknownOutcome(err) && !errors.Is(err, ErrUnreachable)) {
		l.orphans.put(name, n)
	}
}

// scripted is the mode of an attempt under a remembered token: the script,
// never a native SET, whose reply on finding the lock its own could not
// tell the lease it has left (an orphan's, begun before this attempt).
func (m attemptMode) scripted(canNotify bool) attemptMode {
	switch {
	case m == first && canNotify:
		return pollMarked
	case m <= first:
		return poll
	}
	return m
}

// takeOnce is take's round trip: a native SET when the mode and the client
// allow one, else (or when Lock's first SET found the lock held) the
// acquire script.
func (l *Locker) takeOnce(ctx context.Context, name string, n *names, value any, cfg lockConfig, call *Call, mode attemptMode, start time.Time) ([3]int64, any, error) {
	if call == nil && mode <= first {
		r, native, err := l.takeFree(ctx, name, n, value, cfg, mode == first)
		held := mode == first && err == nil && r[0] != 1
		if native && !held {
			return r, nil, err
		}
	}
	mark := argFresh
	if mode == pollMarked || (mode == first && l.canNotify()) {
		mark = argMark
	}
	return l.dep.acquire(ctx, l, name, n, cfg, call, mark, start)
}

// reentering reports whether arg, acquire.lua's ARGV[2], is a handle id:
// the attempt is a re-entry.
func reentering(arg any) bool { return arg != argFresh && arg != argMark }

// acquire runs the acquire script (or a fragment's) in the Locker's Redis,
// with a WAIT after it when the Locker asks replicas to acknowledge.
func (single) acquire(ctx context.Context, l *Locker, name string, n *names, cfg lockConfig, call *Call, arg any, _ time.Time) ([3]int64, any, error) {
	keys, args := scriptCall(call, n, false, n.token, arg, cfg.ttlMS, l.fenceMS)
	reenter := reentering(arg)
	script := acquireScript
	if call != nil {
		script = call.Fragment.acquire
	}
	var late func(any, error)
	if !reenter && !l.runner.Direct(ctx) { // a call that can be abandoned
		late = l.undoLate(newHold(l, name, *n))
	}
	reply, short, err := l.acquireRun(ctx, script, keys, args, call != nil, reenter || cfg.ackLater, late)
	if err != nil {
		return [3]int64{}, nil, err
	}
	l.scripted.Store(true)
	r, res, err := acquired(reply)
	if err == nil && r[0] == 1 && short != nil {
		// Granted on the master alone: nobody may count on it. The undo
		// keeps to the caller's deadline; past it, the lease ends the lock.
		if ctx.Err() == nil {
			l.releaseRoot(ctx, newHold(l, name, *n))
		}
		return [3]int64{}, nil, short
	}
	return r, res, err
}
