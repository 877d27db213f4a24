package guard

import (
	"context"
	"errors"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// decide runs f with g's Limiter as call does. After Redis came back from
// refusing connections, while the watch detours, a call the client refused
// unsent (go-redis's dial breaker) runs again on the detour: a Limiter of
// the guard's own on a client made from the client's options
// (outage.Watch.Spare), without its hooks. A funnel.WithLocker Locker,
// whose client the breaker holds, and InFlight permits take none.
func (g *Guard) decide(ctx context.Context, f func(context.Context, *funnel.Limiter) error) error {
	return g.call(ctx, func(cctx context.Context) error {
		err := f(cctx, g.lim)
		if !g.detours(err) {
			return err
		}
		if d := g.detour(); d != nil {
			return f(cctx, d)
		}
		return err
	})
}

// detours reports whether a decision that failed with err goes again on
// the detour (not for a closed client: the user's to close).
func (g *Guard) detours(err error) bool {
	return reach.Unreachable(err) && !errors.Is(err, redis.ErrClosed) && g.watch.Detouring()
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
