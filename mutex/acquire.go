package mutex

import (
	"context"
	"errors"
	"fmt"
	"math"
	mathrand "math/rand/v2"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
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
// token of an earlier attempt whose outcome is unknown (retrysafety.go). When
// it finds the lock held under a token this Locker has spent (retrysafety.go), it
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
// the next attempt (retrysafety.go): when the attempt used a remembered token
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

// nativeSetter is the part of a go-redis client that takes a free lock with
// one native SET NX PX [GET], as acquire.lua would, but without a script.
type nativeSetter interface {
	SetArgs(ctx context.Context, key string, value any, a redis.SetArgs) *redis.StatusCmd
	SetNX(ctx context.Context, key string, value any, expiration time.Duration) *redis.BoolCmd
}

// takeFree makes a fresh attempt without a fragment as one native SET NX
// PX, acquire.lua's first step: the uncontended case costs Redis no script.
// It replies as the script would, but with an unknown lease (-1) on
// contention, and serves only the attempts that need neither that lease nor
// a waiter's mark: TryLock, and Lock's first.
//
// A SET whose reply was lost and that go-redis sent again finds the lock
// held by its own token. For TryLock the SET has GET, which tells: a held
// lock is then one reply. Lock's first attempt (followed) does without GET,
// whose nil reply costs go-redis some 17 allocations on the uncontended
// path; when it finds the lock held, its caller goes on with the script
// under the same token, which recognises its own lock as a retry does.
//
// It reports false, and makes no attempt, until a script of this Locker has
// run (so a server that refuses scripts, whose locks could never be released,
// hands out no lock) or when the server has no SET NX GET (Redis before 7.0):
// the caller then runs the script.
func (l *Locker) takeFree(ctx context.Context, name string, n *names, value any, cfg lockConfig, followed bool) ([3]int64, bool, error) {
	if l.setNX == nil || !l.scripted.Load() || l.noSetGet.Load() {
		return [3]int64{}, false, nil
	}
	if followed {
		ok, err := l.setFree(ctx, name, n, value, cfg)
		switch {
		case err != nil:
			return [3]int64{0, -1, 0}, true, err
		case ok:
			return [3]int64{1, cfg.ttl.Milliseconds(), 0}, true, nil
		}
		return [3]int64{0, -1, 0}, true, nil
	}
	token := n.token
	old, err := l.setFreeGet(ctx, name, n, value, cfg)
	switch {
	case err == redis.Nil, err == nil && heldBy(old, token):
		return [3]int64{1, cfg.ttl.Milliseconds(), 0}, true, nil
	case err != nil && strings.Contains(err.Error(), "syntax error"):
		l.noSetGet.Store(true)
		return [3]int64{}, false, nil
	case err != nil:
		return [3]int64{0, -1, 0}, true, err
	}
	return [3]int64{0, -1, 0}, true, nil
}

// setFree is takeFree's SET NX PX, batched (send.go) and bounded by ctx;
// value is n.value, boxed.
func (l *Locker) setFree(ctx context.Context, name string, n *names, value any, cfg lockConfig) (bool, error) {
	if l.batch.alone() {
		ok, err := l.setFreeAlone(ctx, name, n, value, cfg)
		l.batch.free(err)
		return ok, reach.Mark(err)
	}
	key, h := n.key, newHold(l, name, *n)
	undo := l.undoLateSetNX(h)
	cmd, err := l.batch.do(&queued{
		ctx:  ctx,
		add:  func(p redis.Pipeliner) redis.Cmder { return p.SetNX(ctx, key, value, cfg.ttl) },
		late: func(c redis.Cmder) { undo(c.(*redis.BoolCmd).Result()) },
	})
	if err != nil {
		return false, err
	}
	ok, err := cmd.(*redis.BoolCmd).Result()
	return ok, reach.Mark(err)
}

// setFreeAlone is setFree without batching.
func (l *Locker) setFreeAlone(ctx context.Context, name string, n *names, value any, cfg lockConfig) (bool, error) {
	if l.runner.Direct(ctx) {
		return l.setNX.SetNX(ctx, n.key, value, cfg.ttl).Result()
	}
	key := n.key
	return ctxcall.Do(ctx, l.runner.Workers(ctx), func(ctx context.Context) (bool, error) {
		return l.setNX.SetNX(ctx, key, value, cfg.ttl).Result()
	}, l.undoLateSetNX(newHold(l, name, *n)))
}

// setFreeGet is takeFree's SET NX PX GET, batched (send.go) and bounded
// by ctx; value is n.value, boxed.
func (l *Locker) setFreeGet(ctx context.Context, name string, n *names, value any, cfg lockConfig) (string, error) {
	if l.batch.alone() {
		old, err := l.setFreeGetAlone(ctx, name, n, value, cfg)
		l.batch.free(err)
		return old, reach.Mark(err)
	}
	key, h := n.key, newHold(l, name, *n)
	undo := l.undoLateSet(h)
	cmd, err := l.batch.do(&queued{
		ctx:  ctx,
		add:  func(p redis.Pipeliner) redis.Cmder { return p.SetArgs(ctx, key, value, setGetArgs(cfg)) },
		late: func(c redis.Cmder) { undo(c.(*redis.StatusCmd).Result()) },
	})
	if err != nil {
		return "", err
	}
	old, err := cmd.(*redis.StatusCmd).Result()
	return old, reach.Mark(err)
}

// setFreeGetAlone is setFreeGet without batching.
func (l *Locker) setFreeGetAlone(ctx context.Context, name string, n *names, value any, cfg lockConfig) (string, error) {
	if l.runner.Direct(ctx) { // no closures on the common path
		return l.setNX.SetArgs(ctx, n.key, value, setGetArgs(cfg)).Result()
	}
	key := n.key
	return ctxcall.Do(ctx, l.runner.Workers(ctx), func(ctx context.Context) (string, error) {
		return l.setNX.SetArgs(ctx, key, value, setGetArgs(cfg)).Result()
	}, l.undoLateSet(newHold(l, name, *n)))
}

// setGetArgs are the arguments of a SET NX PX GET with cfg's lease.
func setGetArgs(cfg lockConfig) redis.SetArgs {
	return redis.SetArgs{Mode: "NX", TTL: cfg.ttl, Get: true}
}

// undoLateSetNX is undoLate for takeFree's SET without GET: a late reply
// that found the lock held may be a retry of its own SET.
func (l *Locker) undoLateSetNX(h *hold) func(bool, error) {
	return func(_ bool, err error) {
		if (err == nil || l.lateUnknown(err)) && l.mayUndo(h) {
			l.releaseOrphan(h)
		}
	}
}

// undoLateSet is undoLate for takeFree.
func (l *Locker) undoLateSet(h *hold) func(string, error) {
	return func(old string, err error) {
		if (err == redis.Nil || (err == nil && heldBy(old, h.token)) || (err != nil && l.lateUnknown(err))) && l.mayUndo(h) {
			l.releaseOrphan(h)
		}
	}
}

// mayUndo reports whether a late reply may release the lock of h, an
// attempt whose caller left: always on a client that ignores deadlines
// (whose attempts are not remembered), else only if h's token is still
// remembered, unused, and is taken out of the memory now (orphans.claim):
// an attempt may have adopted the lock under it meanwhile.
func (l *Locker) mayUndo(h *hold) bool {
	return !l.honours || l.orphans.claim(h.name, h.token)
}

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
