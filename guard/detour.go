package guard

import (
	"context"
	"errors"
	"sync"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// A detour: for outage.Detour after Redis came back from refusing
// connections, a call the client refuses unsent (go-redis's dial breaker
// refuses new connections for up to a second after PoolSize failed dials)
// is made again with a Limiter of the guard's own on a client made from the
// client's options (outage.Watch.Spare), without its hooks. A funnel.WithLocker
// Locker, whose client the breaker holds, and InFlight permits take none.
type detour struct {
	once sync.Once
	lim  *funnel.Limiter // nil: no detour
}

// decide runs f with g's Limiter as call does, and again with the detour's
// when the client refused it unsent while the watch detours.
func (g *Guard) decide(ctx context.Context, f func(context.Context, *funnel.Limiter) error) error {
	return g.call(ctx, func(cctx context.Context) error {
		err := f(cctx, g.lim)
		if !g.detours(err) {
			return err
		}
		if d := g.detourLimiter(); d != nil {
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

// detourLimiter is the detour's Limiter, made at the first call; nil if none.
func (g *Guard) detourLimiter() *funnel.Limiter {
	g.detour.once.Do(func() {
		c := g.watch.Spare()
		if c == nil {
			return
		}
		lim, err := funnel.New(c, g.cfg.Funnel...)
		if err != nil || lim.Locker() == g.lim.Locker() {
			return // the guard's options passed New with the client; a Locker of their own
		}
		g.detour.lim = lim
	})
	return g.detour.lim
}
