package guard

import (
	"context"
	"errors"
	"sync"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// A detour: for a while after Redis came back from refusing connections
// (outage.Detour), a call that the client refuses without reaching Redis
// (go-redis's dial breaker, open for up to a second after PoolSize failed
// dials, refuses every new connection though the server answers) is made
// again with a Limiter of the guard's own on a client of its own
// (outage.Watch.Spare), made at the first detour from the client's options
// and the Policy's. So the first calls after a restart are answered, and a
// call goes through the client whenever the client can send it: the
// client's hooks see every command sent, and the refused attempt of a
// detoured call; the spare client has none of them, so the detoured
// command itself is not seen. A Policy whose Funnel options bring a Locker of their own
// (funnel.WithLocker) has no detour: the Locker's client is the one the
// breaker holds. InFlight's permits take no detour either.
type detour struct {
	once sync.Once
	lim  *funnel.Limiter // nil: no detour
}

// decide runs f, a decision of g's rules, as call does, with g's Limiter,
// and again with the detour's when the client refused it while the watch
// detours (the refusal sent nothing: the call is made once in Redis).
func (g *Guard) decide(ctx context.Context, f func(context.Context, *funnel.Limiter) error) error {
	return g.call(ctx, func(cctx context.Context) error {
		err := f(cctx, g.lim)
		if err == nil || !reach.Unreachable(err) || errors.Is(err, redis.ErrClosed) || !g.watch.Detouring() {
			return err // a closed client is the user's to close: no detour
		}
		if d := g.detourLimiter(); d != nil {
			return f(cctx, d)
		}
		return err
	})
}

// detourLimiter returns the detour's Limiter, made at the first call, or
// nil when the guard has none.
func (g *Guard) detourLimiter() *funnel.Limiter {
	g.detour.once.Do(func() {
		c := g.watch.Spare()
		if c == nil {
			return
		}
		lim, err := funnel.New(c, funnelOptions(g.p)...)
		if err != nil || lim.Locker() == g.lim.Locker() {
			return // the Policy's options passed New with the client; a Locker of their own
		}
		g.detour.lim = lim
	})
	return g.detour.lim
}
