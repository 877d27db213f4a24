package mutex

import (
	"context"
	"errors"
	"fmt"
	"math"
	mathrand "math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
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
func (l *Locker) TryLock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
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
func (l *Locker) TryLockWith(ctx context.Context, name string, call Call, opts ...LockOption) (*Lock, any, error) {
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
// An attempt cut short by ctx has an unknown outcome: if Redis ran it, the
// lock stays under this call's token, held by nobody, until its lease ends.
// Re-entry through ctx works as in TryLock and never waits.
//
// While it waits, the call polls Redis only if it heads this Locker's queue
// for the name, at a jittered retry interval, or just after the holder's lease
// ends if that is sooner; a release notification or a local hand-over ends the
// wait early (see Locker).
func (l *Locker) Lock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
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
func (l *Locker) LockWith(ctx context.Context, name string, call Call, opts ...LockOption) (*Lock, any, error) {
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
	r, res, err := l.acquireScript(ctx, h.name, &h.names, cfg, call, argID(id), start)
	switch {
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
		h.startRenew(cfg.ttl)
	}
	return lk, -1, res, nil
}

// take makes one attempt to acquire name under a new token. The hold is
// made only once the lock is obtained: a denial or a failed attempt needs
// none.
func (l *Locker) take(ctx context.Context, name string, cfg lockConfig, call *Call, mode attemptMode) (*Lock, time.Duration, any, error) {
	n := l.names(name)
	value := any(n.value) // boxed once: the SET's argument and the hold's
	start := time.Now()
	r, res, err := l.takeOnce(ctx, name, &n, value, cfg, call, mode, start)
	switch {
	case err != nil:
		return nil, -1, nil, fmt.Errorf("mutex: acquire %q: %w", name, err)
	case r[0] == declinedReply:
		return nil, -1, res, ErrDeclined
	case r[0] != 1:
		return nil, time.Duration(r[1]) * time.Millisecond, res, ErrLocked
	}
	lk := newRoot(l, name, n, value, r[2])
	lk.hold.add(lk, start, time.Duration(r[1])*time.Millisecond)
	if cfg.renew {
		lk.hold.startRenew(cfg.ttl)
	}
	return lk, -1, res, nil
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
	return l.acquireScript(ctx, name, n, cfg, call, mark, start)
}

// acquireScript runs the acquire script (a fragment's, a quorum's) for n's
// token; arg is acquire.lua's ARGV[2]: argFresh or argMark for a fresh
// token (argMark: mark a held lock), a handle id for a re-entry. It returns the
// script's reply, {1, lease, fence} or {0, pttl, 0}, and the fragment's
// result.
func (l *Locker) acquireScript(ctx context.Context, name string, n *names, cfg lockConfig, call *Call, arg any, start time.Time) ([3]int64, any, error) {
	keys, args := scriptCall(call, n, false, n.token, arg, cfg.ttlMS, l.fenceMS)
	reenter := arg != argFresh && arg != argMark // a handle id
	if l.q != nil {                              // no fragment: NewQuorum refuses them
		r, err := l.q.acquire(ctx, keys, args, cfg.ttl, reenter, start, n)
		return r, nil, err
	}
	script := acquireScript
	if call != nil {
		script = call.Fragment.acquire
	}
	var late func(any, error)
	if !reenter && !l.honours {
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

// setFree is takeFree's SET NX PX, batched (batch.go) and bounded by ctx;
// value is n.value, boxed.
func (l *Locker) setFree(ctx context.Context, name string, n *names, value any, cfg lockConfig) (bool, error) {
	if l.batch.alone() {
		defer l.batch.free()
		return l.setFreeAlone(ctx, name, n, value, cfg)
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
	return cmd.(*redis.BoolCmd).Result()
}

// setFreeAlone is setFree without batching.
func (l *Locker) setFreeAlone(ctx context.Context, name string, n *names, value any, cfg lockConfig) (bool, error) {
	if l.honours || ctx.Done() == nil {
		return l.setNX.SetNX(ctx, n.key, value, cfg.ttl).Result()
	}
	key := n.key
	return ctxcall.Do(ctx, false, func(ctx context.Context) (bool, error) {
		return l.setNX.SetNX(ctx, key, value, cfg.ttl).Result()
	}, l.undoLateSetNX(newHold(l, name, *n)))
}

// setFreeGet is takeFree's SET NX PX GET, batched (batch.go) and bounded
// by ctx; value is n.value, boxed.
func (l *Locker) setFreeGet(ctx context.Context, name string, n *names, value any, cfg lockConfig) (string, error) {
	if l.batch.alone() {
		defer l.batch.free()
		return l.setFreeGetAlone(ctx, name, n, value, cfg)
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
	return cmd.(*redis.StatusCmd).Result()
}

// setFreeGetAlone is setFreeGet without batching.
func (l *Locker) setFreeGetAlone(ctx context.Context, name string, n *names, value any, cfg lockConfig) (string, error) {
	if l.honours || ctx.Done() == nil { // no closures on the common path
		return l.setNX.SetArgs(ctx, n.key, value, setGetArgs(cfg)).Result()
	}
	key := n.key
	return ctxcall.Do(ctx, false, func(ctx context.Context) (string, error) {
		return l.setNX.SetArgs(ctx, key, value, setGetArgs(cfg)).Result()
	}, l.undoLateSet(newHold(l, name, *n)))
}

// setGetArgs are the arguments of a SET NX PX GET with cfg's lease.
func setGetArgs(cfg lockConfig) redis.SetArgs {
	return redis.SetArgs{Mode: "NX", TTL: cfg.ttl, Get: true}
}

// run runs script on the Locker's client, returning by ctx's deadline even
// when the client ignores it (ctxcall); late, if not nil, receives a reply
// that came after the caller left.
func (l *Locker) run(ctx context.Context, script *redis.Script, keys []string, args []any, late func(any, error)) (any, error) {
	if l.batch.alone() {
		defer l.batch.free()
		return l.runAlone(ctx, script, keys, args, late)
	}
	q := &queued{
		ctx:   ctx,
		add:   func(p redis.Pipeliner) redis.Cmder { return script.EvalSha(ctx, p, keys, args...) },
		again: func(p redis.Pipeliner) redis.Cmder { return script.Eval(ctx, p, keys, args...) },
	}
	if late != nil {
		q.late = func(c redis.Cmder) { late(c.(*redis.Cmd).Result()) }
	}
	cmd, err := l.batch.do(q)
	if err != nil {
		return nil, err
	}
	return cmd.(*redis.Cmd).Result()
}

// runAlone is run without batching.
func (l *Locker) runAlone(ctx context.Context, script *redis.Script, keys []string, args []any, late func(any, error)) (any, error) {
	if l.honours || ctx.Done() == nil {
		return script.Run(ctx, l.client, keys, args...).Result()
	}
	return ctxcall.Do(ctx, false, func(ctx context.Context) (any, error) {
		return script.Run(ctx, l.client, keys, args...).Result()
	}, late)
}

// acquireRun runs an acquire script, followed by WAIT when the Locker waits
// for replicas (WithReplicaAck): in the same round trip for a plain attempt;
// only once the lock is granted for one with a fragment, whose gate may
// decline (a denial costs no wait). nowait skips the wait: a re-entry grants
// nobody a lock they did not hold, and AckAtRelease leaves it to the
// release. short reports a grant that not enough replicas acknowledged.
func (l *Locker) acquireRun(ctx context.Context, script *redis.Script, keys []string, args []any, fragment, nowait bool, late func(any, error)) (reply any, short, err error) {
	switch {
	case l.acks == 0 || nowait:
		reply, err = l.run(ctx, script, keys, args, late)
		return reply, nil, err
	case fragment:
		return l.runThenWait(ctx, script, keys, args, grants, late)
	}
	return l.runAcked(ctx, script, keys, args, late)
}

// grants reports whether an acquire script's reply granted the lock.
func grants(reply any) bool {
	r, _, err := acquired(reply)
	return err == nil && r[0] == 1
}

// undoLate returns what to do with an acquire script's reply that came after
// its caller left: release the lock of h (the attempt's token, held by
// nobody) if the attempt took it, or may have.
func (l *Locker) undoLate(h *hold) func(any, error) {
	return func(reply any, err error) {
		if err != nil && !unknownOutcome(err) {
			return
		}
		if r, _, aerr := acquired(reply); err != nil || (aerr == nil && r[0] == 1) {
			l.releaseOrphan(h)
		}
	}
}

// undoLateSetNX is undoLate for takeFree's SET without GET: a late reply
// that found the lock held may be a retry of its own SET.
func (l *Locker) undoLateSetNX(h *hold) func(bool, error) {
	return func(_ bool, err error) {
		if err == nil || unknownOutcome(err) {
			l.releaseOrphan(h)
		}
	}
}

// undoLateSet is undoLate for takeFree.
func (l *Locker) undoLateSet(h *hold) func(string, error) {
	return func(old string, err error) {
		if err == redis.Nil || (err == nil && heldBy(old, h.token)) || (err != nil && unknownOutcome(err)) {
			l.releaseOrphan(h)
		}
	}
}

// unknownOutcome reports whether a command that failed with err may have
// run: err is not Redis's reply (a time-out, a lost connection).
func unknownOutcome(err error) bool {
	var reply redis.Error
	return err != nil && err != redis.Nil && !errors.As(err, &reply)
}

// releaseOrphan releases the root handle of h, a lock that an attempt took
// after its caller gave up.
func (l *Locker) releaseOrphan(h *hold) {
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	l.releaseRoot(ctx, h)
}

// orphanOf returns what to do with the late reply of a release that may
// have handed the lock to h: release it, since nobody will hold it.
func (l *Locker) orphanOf(h *hold) func(any, error) {
	return func(any, error) { l.releaseOrphan(h) }
}

// releaseRoot releases the root handle of h, bounded by ctx (run, so even
// on a client that ignores deadlines).
func (l *Locker) releaseRoot(ctx context.Context, h *hold) {
	seq, st := l.releases.begin()
	owner, sseq, smark := st.releaseArgs()
	keys, args := scriptCall(nil, &h.names, true, h.token, argZero, argFresh, 0, l.fenceMS, owner, sseq, smark)
	_, err := l.run(ctx, releaseScript, keys, args, nil)
	l.releases.end(seq, err == nil)
}

// scriptCall returns the keys and arguments of a lock script run with
// call's fragment (nil for none): the fragment's first, then the keys of
// n's lock (lockKeys; with its release records for a release), and
// lockArgs (fragment.go).
func scriptCall(call *Call, n *names, release bool, lockArgs ...any) ([]string, []any) {
	var nk, na int
	if call != nil {
		nk, na = len(call.Keys), len(call.Args)
	}
	keys := make([]string, 0, nk+4)
	args := make([]any, 0, na+len(lockArgs))
	if call != nil {
		keys = append(keys, call.Keys...)
		args = append(args, call.Args...)
	}
	return lockKeys(keys, n, release), append(args, lockArgs...)
}

// handleID is a handle's id as the scripts take it; the root handle's needs
// no allocation.
func handleID(id uint64) string {
	if id == 0 {
		return "0"
	}
	return strconv.FormatUint(id, 10)
}

// Script arguments boxed once: converting even a constant string returned by
// a function to an interface allocates.
var (
	argZero  any = "0"
	argFresh any = ""
	argMark  any = "m"
)

// argID is handleID as a script argument.
func argID(id uint64) any {
	if id == 0 {
		return argZero
	}
	return handleID(id)
}
