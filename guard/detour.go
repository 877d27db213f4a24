package guard

import (
	"context"
	"errors"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/reach"
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
		// A closed client is the user's to close: no detour.
		refused := reach.Unreachable(err) && !errors.Is(err, redis.ErrClosed)
		if refused && g.watch.Detouring() && g.detour() != nil {
			res, err = f(cctx, g.detour())
		}
		return err
	})
	if err != nil {
		return g.failed(ctx, err)
	}
	return decision(res), nil
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
