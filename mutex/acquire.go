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
	"github.com/redis/go-redis/v9"
)

// TryLock makes one attempt to acquire the lock on name, or returns
// ErrLocked. If ctx carries this Locker's lock on name (Lock.Context), it
// re-enters it instead: the new handle must be unlocked too (ErrNotHeld if
// that lock has ended).
func (l *Locker) TryLock(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	lk, _, err := l.obtain(ctx, name, nil, opts, false)
	return lk, err
}

// TryLockWith is TryLock that also runs call.Fragment in the same script as
// the attempt, and returns its result whether or not the lock was obtained.
func (l *Locker) TryLockWith(ctx context.Context, name string, call Call, opts ...Option) (*Lock, any, error) {
	return l.obtain(ctx, name, &call, opts, false)
}

// obtain is TryLock's one attempt, or Lock's wait when wait is set, unless
// ctx carries the lock: then either re-enters it.
func (l *Locker) obtain(ctx context.Context, name string, call *Call, opts []Option, wait bool) (*Lock, any, error) {
	cfg, err := l.begin(ctx, name, call, opts)
	if err != nil {
		return nil, nil, err
	}
	var lk *Lock
	var res any
	switch h := ownerOf(ctx, l, name); {
	case h != nil:
		lk, res, err = l.reenter(ctx, h, cfg, call)
	case wait:
		lk, res, err = l.lock(ctx, name, cfg, call)
	default:
		lk, _, res, err = l.take(ctx, name, cfg, call, tryOnce)
	}
	if lk != nil && cfg.renew { // the one place a lock's renewal starts
		lk.hold.startRenew(lk.hold, cfg.ttl)
	}
	return lk, res, err
}

// Lock acquires the lock on name, waiting as long as ctx allows. When ctx
// ends first it returns an error matching both ErrNotObtained and ctx.Err();
// a Redis error, ErrUnreachable included, ends the wait at once. Re-entry
// through ctx works as in TryLock and never waits.
func (l *Locker) Lock(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	lk, _, err := l.obtain(ctx, name, nil, opts, true)
	return lk, err
}

// LockWith is Lock that runs call.Fragment with every attempt and returns
// the winning attempt's result (after a local hand-over, run under the lock
// right after). A gate that declines ends the wait with
// ErrDeclined and the gate's result.
func (l *Locker) LockWith(ctx context.Context, name string, call Call, opts ...Option) (*Lock, any, error) {
	return l.obtain(ctx, name, &call, opts, true)
}

// lock is Lock's wait for a lock that ctx does not carry. Without a
// fragment or other waiters, its first attempt is made without a queue, and
// on contention stands for the queue head's first (primed).
func (l *Locker) lock(ctx context.Context, name string, cfg lockConfig, call *Call) (*Lock, any, error) {
	if ctx.Err() != nil {
		return nil, nil, errors.Join(ErrNotObtained, ctx.Err())
	}
	primed, pttl := false, time.Duration(-1)
	if call == nil && (l.nqueues.Load() == 0 || l.Waiters(name) == 0) {
		lk, left, _, err := l.take(ctx, name, cfg, nil, first)
		switch {
		case err == nil:
			return lk, nil, nil
		case ctx.Err() != nil:
			return nil, nil, errors.Join(ErrNotObtained, ctx.Err())
		case !errors.Is(err, ErrLocked):
			return nil, nil, err
		}
		primed, pttl = true, left
	}
	o := l.wait(ctx, name, cfg, call, primed, pttl)
	if !o.handed || call == nil {
		return o.lk, o.res, o.err
	}
	return l.runHanded(ctx, name, o.lk, *call)
}

// runHanded runs call's fragment for lk, handed over locally without it.
func (l *Locker) runHanded(ctx context.Context, name string, lk *Lock, call Call) (*Lock, any, error) {
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

func (l *Locker) begin(ctx context.Context, name string, call *Call, opts []Option) (lockConfig, error) {
	switch {
	case ctx == nil:
		return lockConfig{}, ErrNilContext
	case l == nil:
		return lockConfig{}, errNilLocker
	}
	if call != nil {
		if err := call.check(l.dep); err != nil {
			return lockConfig{}, err
		}
	}
	if err := checkName(name); err != nil {
		return lockConfig{}, err
	}
	if len(opts) == 0 { // the common call: its path stays out of options.go
		return l.defaults, nil
	}
	return l.options(opts)
}

// nextWait is the pause before the next attempt: a jittered retry interval,
// or just past the end of the holder's lease when that comes sooner.
func (l *Locker) nextWait(pttl time.Duration) time.Duration {
	wait := l.jittered(l.retry / 2)
	if pttl >= 0 && pttl+time.Millisecond < wait {
		wait = pttl + time.Millisecond
	}
	return wait
}

// jittered is base plus up to a retry interval, saturated: a retry
// interval of centuries must not wrap to a negative wait (which would mean
// "no timer").
func (l *Locker) jittered(base time.Duration) time.Duration {
	jitter := time.Duration(mathrand.Int64N(int64(l.retry)))
	if jitter > math.MaxInt64-base {
		return math.MaxInt64
	}
	return base + jitter
}

// An attemptMode says what one acquire attempt is for.
type attemptMode uint8

const (
	tryOnce attemptMode = iota // TryLock's: a native SET NX PX GET when it can be
	first                      // Lock's first: a native SET NX PX, then the script if held
	poll                       // a waiting head's: the script, reading the lease left and marking the lock (its release publishes)
)

// take makes one attempt under a fresh or remembered token (acquireSafely).
func (l *Locker) take(ctx context.Context, name string, cfg lockConfig, call *Call, mode attemptMode) (*Lock, time.Duration, any, error) {
	var value any
	var start time.Time
	n, adopted, r, res, err := l.acquireSafely(ctx, name, func(n names, adopted bool) ([3]int64, any, error) {
		// Boxed once, the SET's argument and the hold's; with a fragment
		// (no SET) only once the lock is obtained.
		if call == nil {
			value = n.value
		}
		start = time.Now()
		return l.takeOnce(ctx, name, &n, value, cfg, call, mode, adopted, start)
	})
	switch {
	case err != nil:
		return nil, -1, nil, opErr("acquire", name, err)
	case r[0] == declinedReply:
		l.declined(name) // waiters of this Locker for name likely hear "no" too
		return nil, -1, res, ErrDeclined
	case r[0] != 1:
		return nil, time.Duration(r[1]) * time.Millisecond, res, ErrLocked
	}
	if value == nil {
		value = n.value
	}
	lk := newRoot(l, name, n, value, r[2], adopted, start, time.Duration(r[1])*time.Millisecond)
	return lk, -1, res, nil
}

// A root is a hold and its root handle in one allocation.
type root struct {
	h  hold
	lk Lock
}

// newRoot returns the root handle of a lock just obtained, its lease set by
// a script sent at sent; nobody else sees it yet, so it needs no locking.
func newRoot(l *Locker, name string, n names, value any, fence int64, adopted bool, sent time.Time, lease time.Duration) *Lock {
	r := &root{h: hold{locker: l, name: name, names: n, valueArg: value, fence: fence, adopted: adopted}}
	r.lk.hold = &r.h
	r.h.one[0] = &r.lk
	r.h.handles = r.h.one[:1]
	r.h.sent, r.h.lease = sent, lease
	return &r.lk
}

// takeOnce is take's round trip: a native SET if allowed, else the script
// (always for an adopted token: a SET could not tell the orphan's lease left).
func (l *Locker) takeOnce(ctx context.Context, name string, n *names, value any, cfg lockConfig, call *Call, mode attemptMode, adopted bool, start time.Time) ([3]int64, any, error) {
	if call == nil && mode <= first && !adopted {
		if r, native, err := l.takeFree(ctx, name, n, value, cfg, mode == first); native {
			return r, nil, err
		}
	}
	mark := argFresh
	if mode == poll || (mode == first && l.notify) {
		mark = argMark
	}
	return l.dep.acquire(ctx, l, name, n, cfg, call, mark, start)
}

// reentering reports whether arg, acquire.lua's ARGV[2], is a handle id.
func reentering(arg any) bool { return arg != argFresh && arg != argMark }

func (single) acquire(ctx context.Context, l *Locker, name string, n *names, cfg lockConfig, call *Call, arg any, _ time.Time) ([3]int64, any, error) {
	keys, args := scriptCall(call, n, false, n.token, arg, cfg.ttlMS, l.fenceMS)
	reenter := reentering(arg)
	var late func(any, error)
	if !reenter && !l.runner.Direct(ctx) { // it can be abandoned
		late = l.undoLate(newHold(l, name, *n))
	}
	reply, short, err := l.runWithAck(ctx, acquireOf(call), keys, args, call != nil, reenter || cfg.ackLater, late)
	if err != nil {
		return [3]int64{}, nil, err
	}
	l.scripted.Store(true)
	r, res, err := acquired(reply)
	if err == nil && r[0] == 1 && short != nil {
		// Granted on the master alone: undone within the caller's deadline.
		if ctx.Err() == nil {
			l.releaseRoot(ctx, newHold(l, name, *n))
		}
		return [3]int64{}, nil, short
	}
	return r, res, err
}

// takeFree makes an attempt as one native SET NX PX, replying as
// acquire.lua would (lease -1 on contention). A repeated SET finds its own
// token: TryLock's has GET to tell; Lock's (followed) reports false when it
// finds the lock held, and the script follows under the same token, which
// tells. It also reports false, sending nothing, until a script of this
// Locker has run (a server that refuses scripts must hand out no lock it
// cannot release), or without SET NX GET (Redis < 7.0).
func (l *Locker) takeFree(ctx context.Context, name string, n *names, value any, cfg lockConfig, followed bool) ([3]int64, bool, error) {
	if l.setNX == nil || !l.scripted.Load() || l.noSetGet.Load() {
		return [3]int64{}, false, nil
	}
	took, err := l.setFree(ctx, name, n, freeSet{key: n.key, token: n.token, value: value, ttl: cfg.ttl, getOld: !followed})
	switch {
	case took:
		return [3]int64{1, cfg.ttl.Milliseconds(), 0}, true, nil
	case followed && err == nil:
		return [3]int64{}, false, nil // found held: the script follows
	case !followed && err != nil && strings.Contains(err.Error(), "syntax error"):
		l.noSetGet.Store(true)
		return [3]int64{}, false, nil
	}
	return [3]int64{0, -1, 0}, true, err
}

// A freeSet is takeFree's SET NX PX, with GET when getOld.
type freeSet struct {
	key, token string
	value      any
	ttl        time.Duration
	getOld     bool
}

func (s freeSet) cmd(ctx context.Context, c redis.StringCmdable) redis.Cmder {
	if s.getOld {
		return c.SetArgs(ctx, s.key, s.value, redis.SetArgs{Mode: "NX", TTL: s.ttl, Get: true})
	}
	return c.SetNX(ctx, s.key, s.value, s.ttl)
}

// took reads the SET's reply: whether the token holds the lock now.
func (s freeSet) took(c redis.Cmder) (bool, error) {
	if !s.getOld {
		return c.(*redis.BoolCmd).Result()
	}
	old, err := c.(*redis.StatusCmd).Result()
	if err == redis.Nil {
		return true, nil
	}
	return err == nil && heldBy(old, s.token), err
}

func (l *Locker) setFree(ctx context.Context, name string, n *names, s freeSet) (bool, error) {
	if l.batch.alone() {
		took, err := l.setFreeAlone(ctx, name, n, s)
		l.batch.free(err)
		return took, marked(err)
	}
	undo := l.undoLateSet(newHold(l, name, *n), s.getOld)
	c, err := l.batch.do(&queued{
		ctx:  ctx,
		add:  func(p redis.Pipeliner) redis.Cmder { return s.cmd(ctx, p) },
		late: func(c redis.Cmder) { undo(c, c.Err()) },
	})
	if err != nil {
		return false, err
	}
	took, err := s.took(c)
	return took, marked(err)
}

func (l *Locker) setFreeAlone(ctx context.Context, name string, n *names, s freeSet) (bool, error) {
	if l.runner.Direct(ctx) { // no closures on the common path
		return s.took(s.cmd(ctx, l.setNX))
	}
	c, err := ctxcall.Do(ctx, l.runner.Workers(ctx), func(ctx context.Context) (redis.Cmder, error) {
		c := s.cmd(ctx, l.setNX)
		return c, c.Err()
	}, l.undoLateSet(newHold(l, name, *n), s.getOld))
	if c == nil {
		return false, err
	}
	if took, cerr := s.took(c); cerr == nil {
		return took, nil
	}
	return false, err // as ctxcall.Do gave it
}

// undoLateSet is undoLate for takeFree's SET, whose reply found the lock
// held without GET: it may have found the SET's own repeat.
func (l *Locker) undoLateSet(h *hold, getOld bool) func(redis.Cmder, error) {
	return func(c redis.Cmder, err error) {
		took, _ := freeSet{token: h.token, getOld: getOld}.took(c)
		l.undoIf(h, took || (!getOld && err == nil), err)
	}
}

// ownerKey is the context key of the chain of holds a context carries.
type ownerKey struct{}

type owner struct {
	hold *hold
	next *owner
}

func ownerOf(ctx context.Context, l *Locker, name string) *hold {
	for o, _ := ctx.Value(ownerKey{}).(*owner); o != nil; o = o.next {
		if o.hold.locker == l && o.hold.name == name {
			return o.hold
		}
	}
	return nil
}

// reenter adds a handle to h, which ctx carries. The hold is busy meanwhile
// (Lock.use), so its last handle is not handed over locally.
func (l *Locker) reenter(ctx context.Context, h *hold, cfg lockConfig, call *Call) (*Lock, any, error) {
	if h.enter(nil) != nil {
		return nil, nil, fmt.Errorf("%w: re-entry of %q, whose owning lock has ended", ErrNotHeld, h.name)
	}
	defer h.exit()
	id := h.nextID.Add(1)
	start := time.Now()
	r, res, err := l.dep.acquire(ctx, l, h.name, &h.names, cfg, call, argID(id), start)
	switch {
	case err != nil && h.hasEnded():
		// The owning lock ended meanwhile (a ctx it carries ends then too).
		return nil, nil, fmt.Errorf("%w: re-entry of %q, whose owning lock ended meanwhile", ErrNotHeld, h.name)
	case err != nil:
		return nil, nil, opErr("acquire", h.name, err)
	case r[0] == declinedReply:
		l.declined(h.name)
		return nil, res, ErrDeclined
	case r[0] != 1:
		h.lose()
		return nil, res, fmt.Errorf("%w: re-entry of %q, whose owning lock is gone from Redis", ErrNotHeld, h.name)
	}
	lk := &Lock{hold: h, id: id}
	h.add(lk, start, time.Duration(r[1])*time.Millisecond)
	return lk, res, nil
}
