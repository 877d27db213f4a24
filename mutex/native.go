package mutex

import (
	"context"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

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

// setFreeGet is takeFree's SET NX PX GET, batched (batch.go) and bounded
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
