package guard

import (
	"context"
	"sync"

	"github.com/funnelguard/funnelguard/funnel"
)

// A detour: for a while after Redis came back from refusing connections
// (outage.Detour), the guard decides with a Limiter of its own on a client
// of its own (outage.Watch.Spare), made at the first detour from the
// client's options and the Policy's, so that the first calls after a
// restart are answered even while go-redis's dial breaker still refuses
// every new connection of the client (for up to a second). The spare
// client has none of the client's hooks: commands sent in a detour are not
// seen by them. A Policy whose Funnel options bring a Locker of their own
// (funnel.WithLocker) has no detour: the Locker's client is the one the
// breaker holds. InFlight's permits take no detour either.
type detour struct {
	once sync.Once
	lim  *funnel.Limiter // nil: no detour
}

// decide runs f, a decision of g's rules, as call does, with the Limiter
// of the moment: the detour's while the watch says so, else g's own.
func (g *Guard) decide(ctx context.Context, f func(context.Context, *funnel.Limiter) error) error {
	lim := g.lim
	if g.watch.Detouring() {
		if d := g.detourLimiter(); d != nil {
			lim = d
		}
	}
	return g.call(ctx, func(cctx context.Context) error { return f(cctx, lim) })
}

// detourLimiter returns the detour's Limiter, made at the first call, or
// nil when the guard has none.
func (g *Guard) detourLimiter() *funnel.Limiter {
	g.detour.once.Do(func() {
		c := g.watch.Spare()
		if c == nil {
			return
		}
		lim, err := funnel.New(c, g.funnelOptions()...)
		if err != nil || lim.Locker() == g.lim.Locker() {
			return // the Policy's options passed New with the client; a Locker of their own
		}
		g.detour.lim = lim
	})
	return g.detour.lim
}
