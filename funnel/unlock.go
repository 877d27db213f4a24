package funnel

import (
	"context"
	"errors"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/funnelguard/funnelguard/mutex"
)

// releaseTimeout bounds a release that finishes after its call returned.
const releaseTimeout = 2 * time.Second

// unlock releases lk, running call (nil: none) as it does: from the
// caller's goroutine while ctx has time left, then, if that release failed
// without saying the lock is gone, once more in a goroutine of its own,
// bounded by releaseTimeout (the same call: the first may have run, and its
// record answers the second). With no time left, only a plain release, in
// that goroutine. Either way the call returns by its deadline, and a lock it
// took is released as soon as Redis answers again rather than when its
// lease ends (a reply that came just before a server stopped, or a
// starved process that read it late, left locks for the lease before).
func (lim *Limiter) unlock(ctx context.Context, lk *mutex.Lock, call *mutex.Call) (any, error) {
	if err := ctxcall.Ended(ctx); err != nil {
		go lim.finishRelease(ctx, lk, nil)
		return nil, err
	}
	reply, err := releaseWith(ctx, lk, call)
	if err != nil && !errors.Is(err, mutex.ErrNotHeld) {
		go lim.finishRelease(ctx, lk, call)
	}
	return reply, err
}

// finishRelease releases lk after its caller left, detached from ctx's end.
// Until the server answers a PING of its own (outage.Answering) it waits and
// sends nothing: go-redis would count each of its failed dials toward its
// dial breaker.
func (lim *Limiter) finishRelease(ctx context.Context, lk *mutex.Lock, call *mutex.Call) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if lim.dial != nil && outage.Answering(ctx, lim.dial) != nil {
		return // no answer for releaseTimeout: the lease ends the lock
	}
	_, _ = releaseWith(ctx, lk, call)
}

// releaseWith is lk.UnlockWith(call), or lk.Unlock for no call.
func releaseWith(ctx context.Context, lk *mutex.Lock, call *mutex.Call) (any, error) {
	if call == nil {
		return nil, lk.Unlock(ctx)
	}
	return lk.UnlockWith(ctx, *call)
}
