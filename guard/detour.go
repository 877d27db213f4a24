package guard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// decide runs f with g's Limiter, bounded by Timeout and watched (while
// Redis refuses connections it ends at once: internal/outage), and returns
// its Decision or what failed decides for its error. While the watch
// detours (Redis is back but go-redis's dial breaker still refuses unsent),
// a refused call runs again on a Limiter on outage.Watch.Spare. A
// WithLocker Locker and InFlight permits take none.
func (g *Guard) decide(ctx context.Context, f func(context.Context, *funnel.Limiter) (funnel.Result, error)) (Decision, error) {
	var res funnel.Result
	err := g.watch.Run(ctx, g.cfg.Timeout, func(cctx context.Context) (err error) {
		res, err = f(cctx, g.lim)
		if outage.Refuses(err) && g.watch.Detouring() && g.detour() != nil {
			res, err = f(cctx, g.detour())
		}
		return err
	})
	if err != nil {
		return g.failed(ctx, err)
	}
	return decision(res), nil
}

// failed is what a call that failed with err decides: nothing for a bad n
// or an ended ctx, whose errors pass as they are; else a denial, with
// ErrUnavailable when Redis could not answer, ErrRejected when it refused.
func (g *Guard) failed(ctx context.Context, err error) (Decision, error) {
	d := Decision{RetryAfter: g.cfg.ErrorRetryAfter, Degraded: true}
	switch {
	case errors.Is(err, funnel.ErrInvalidN), ctx.Err() != nil:
		return Decision{}, err
	case unanswered(err):
		return d, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return d, fmt.Errorf("%w: %w", ErrRejected, err)
}

// transientReplies are the codes of the Redis error replies a later call
// may not get: loading, failing over, busy with a script, a lagging replica.
var transientReplies = []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY", "READONLY", "NOREPLICAS", "MOVED", "ASK"}

// unanswered reports whether err is ErrUnavailable's (a time-out, a refused
// connection, a lost quorum, a transient reply), not ErrRejected's (its doc
// lists them; a reply of the wrong shape too).
func unanswered(err error) bool {
	var reply redis.Error
	switch {
	case err == nil, errors.Is(err, funnel.ErrCorruptState), errors.Is(err, mutex.ErrUnexpectedReply),
		errors.Is(err, redis.ErrClosed):
		return false
	case errors.As(err, &reply):
		code, _, _ := strings.Cut(reply.Error(), " ")
		return slices.Contains(transientReplies, code)
	}
	return true
}

// detourLimiter makes the detour's Limiter; nil if none (no Spare client:
// funnel.New refuses a nil one).
func (g *Guard) detourLimiter() *funnel.Limiter {
	lim, err := funnel.New(g.watch.Spare(), g.cfg.Funnel...)
	if err != nil || lim.Locker() == g.lim.Locker() {
		return nil // the guard's options passed New with the client; a Locker of their own
	}
	return lim
}
