package guard

import (
	"cmp"
	"context"
	"errors"
	"sync"

	"github.com/funnelguard/funnelguard/funnel"
)

// A Call is a call that Enter decided: admitted (it may run), denied by
// the rules, or refused (Enter's error). It is a value, safe to copy: its
// copies share one InFlight permit, which the first Done gives back. The
// zero Call is refused and holds nothing.
type Call struct {
	// Decision is AllowN's decision; for a call refused with ErrBusy, the
	// denial that stands for it. Under WithShadow an admitted Call may
	// carry a denial: the one the guard would have enforced.
	Decision Decision

	admitted bool
	ctx      context.Context
	done     func()   // gives back the call's InFlight slot, once; nil if none
	p        *pending // AllowN's call (its decision before ErrBusy), for Middleware's RateLimit field
}

// Enter decides a call of n units for key as Middleware decides a request,
// for servers of other transports (gRPC, queue consumers): AllowN, then,
// with WithInFlight, a permit for the call to hold while it runs. Run
// the call only if Admitted, in Context, and defer Done.
//
//   - Admitted, err nil: the rules admitted it (Degraded: without Redis),
//     or denied it under WithShadow.
//   - Not admitted, err nil: a denial (a 429), by Redis or the fallback.
//   - ErrInvalidKey or funnel.ErrInvalidN: a bad key or n (a 400);
//     ErrNilContext for a nil ctx.
//   - ErrUnavailable (failing closed), ErrRejected, ErrPlan or ErrBusy,
//     with the denial in Decision (a 503 with Retry-After), or ctx's
//     error. Under Shadow a call refused a permit runs without one.
//
// An error never comes with an admitted Call. A failed call is not
// refunded (RefundN). Every decision is reported to WithObserve.
func (g *Guard) Enter(ctx context.Context, key string, n int64) (Call, error) {
	if ctx == nil {
		return Call{}, ErrNilContext
	}
	p := g.start(ctx, key, n)
	defer p.report(g)
	d, err := p.d, p.err
	c := Call{Decision: d, p: p}
	switch {
	case errors.Is(err, ErrInvalidKey), errors.Is(err, funnel.ErrInvalidN):
	case d.Allowed || g.cfg.Shadow: // with its InFlight slot, if any (take)
		s, d, err := g.take(p, g.cfg.Shadow)
		if err != nil {
			c.Decision = d
			return c.in(ctx), err
		}
		c.admitted = true
		if g.cfg.InFlight > 0 { // a slot, or under Shadow none to give back
			c.done = sync.OnceFunc(func() { g.leave(ctx, s) }) // ctx's values, not its end
		}
		return c.in(s.context(ctx)), nil
	case errors.Is(err, ErrUnavailable) && g.open != nil:
		err = nil // a fallback's denial, like Redis's
	}
	return c.in(ctx), err
}

func (c Call) in(ctx context.Context) Call {
	c.ctx = context.WithValue(ctx, decisionKey{}, c.Decision)
	return c
}

// Admitted reports whether the call may go ahead: the rules admitted it
// (or denied it under WithShadow), and it holds its InFlight permit if
// WithInFlight asks for one (WithShadow lets it run without).
func (c Call) Admitted() bool { return c.admitted }

// Context is the context the call runs in: Enter's ctx with the Decision
// in it (FromContext), cancelled if the call's InFlight permit is lost.
// It is context.Background() for the zero Call.
func (c Call) Context() context.Context { return cmp.Or(c.ctx, context.Background()) }

// Done gives back the call's InFlight permit, bounded by the Timeout
// even if Enter's ctx ended (one whose release fails comes back when its
// lease ends). Only the first Done of a Call and its copies does anything.
func (c Call) Done() {
	if c.done != nil {
		c.done()
	}
}
