package guard

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
)

// A Call is a call that Enter decided: admitted (it may run), denied by
// the rules, or refused (Enter's error). It is a value, safe to copy: its
// copies share one InFlight permit, which the first Done gives back. The
// zero Call is refused and holds nothing.
type Call struct {
	// Decision is AllowN's decision for the call; for a call refused with
	// ErrBusy, the denial that stands for it (RetryAfter ErrorRetryAfter,
	// Degraded unless Redis answered). Under Policy.Shadow an admitted
	// Call may carry a denial: the one the guard would have enforced.
	Decision Decision

	admitted bool
	ctx      context.Context
	held     *held // nil unless the call holds an InFlight slot
	// For Middleware's RateLimit field: the stored key ("" for an invalid
	// one) and the plan, AllowN's decision (Decision before ErrBusy
	// replaced it), and whether Redis made it (AllowN returned no error).
	k        keyed
	allowed  Decision
	answered bool
}

// held is the InFlight slot of an admitted Call, given back once.
type held struct {
	g      *Guard
	parent context.Context // Enter's ctx, whose values the release keeps
	s      slot
	once   sync.Once
}

// Enter decides a call of n units for key as Middleware decides a request,
// for servers of other transports (gRPC interceptors, queue consumers):
// AllowN, then, with Policy.InFlight, a permit of the key's semaphore for
// the call to hold while it runs. Run the call only if Admitted, in
// Context, and call Done when it ends (defer it: Done is safe on any
// Call).
//
//   - Admitted, err nil: the rules admitted the call (with FailOpen or a
//     Fallback, perhaps without Redis: Decision.Degraded), or they denied
//     it under Policy.Shadow, which blocks nothing.
//   - Not admitted, err nil: a denial (answer it as a 429), whether Redis
//     or, while it cannot answer, the Fallback or FailOpen's in-process
//     rules made it.
//   - err matching ErrInvalidKey or funnel.ErrInvalidN: a bad key or n (a
//     400); ErrNilContext for a nil ctx.
//   - err matching ErrUnavailable (failing closed) or ErrRejected, with the
//     denial in Decision (a 503 with Retry-After Decision.RetryAfter); or
//     ctx's error when it ended first.
//   - err matching ErrBusy: no permit within Timeout, Policy.InFlight calls
//     of the key kept running; the units the admission took in Redis were
//     given back (a 503 with Retry-After ErrorRetryAfter). Under Shadow the
//     call is admitted without a permit instead.
//
// An error never comes with an admitted Call. Enter does not refund an
// admitted call that fails: a failed attempt counts (RefundN gives units
// back). Like AllowN, it reports every decision to Policy.Observe.
func (g *Guard) Enter(ctx context.Context, key string, n int64) (Call, error) {
	if ctx == nil {
		return Call{}, ErrNilContext
	}
	d, k, dctx, err, ob := g.allowPending(ctx, key, n)
	defer ob.report(g)
	c := Call{Decision: d, k: k, allowed: d, answered: err == nil}
	switch g.judge(d, err) {
	case admitted:
		t0 := time.Now()
		c, err := g.hold(ctx, dctx, c, n)
		ob.waited(g, t0, c.Decision, err)
		return c, err
	case denied:
		return c.in(ctx), nil
	}
	return c.in(ctx), err
}

// hold takes the InFlight slot of c, a call of n units admitted for ctx,
// waiting in dctx, the decision's context (Policy.Trace's). A call refused
// one gets its units back and the ErrBusy (or ErrUnavailable, ErrRejected,
// ctx's) error; under Shadow it runs without one.
func (g *Guard) hold(ctx, dctx context.Context, c Call, n int64) (Call, error) {
	s, err := g.enter(dctx, c.k.sk, c.Decision.Degraded)
	if err != nil && !g.p.Shadow {
		_ = g.giveBack(dctx, c.k, c.Decision, n) // nothing to tell the client: it waits ErrorRetryAfter either way
		c.Decision = g.busyDecision(err)
		return c.in(ctx), err
	}
	c.admitted = true
	if s.permit != nil || s.local != nil {
		c.held = &held{g: g, parent: ctx, s: s}
	}
	return c.in(s.context(ctx)), nil
}

// in is c with the context ctx, carrying c's Decision.
func (c Call) in(ctx context.Context) Call {
	c.ctx = context.WithValue(ctx, decisionKey{}, c.Decision)
	return c
}

// Admitted reports whether the call may go ahead: the rules admitted it,
// or denied it under Policy.Shadow, and it holds its InFlight permit if
// the Policy asks for one (Shadow lets it run without).
func (c Call) Admitted() bool { return c.admitted }

// Context is the context the call runs in: Enter's ctx with the Decision
// in it (FromContext), cancelled if the call's InFlight permit is lost
// (its lease ran out unrenewed), so that a call no longer counted learns
// it. It is context.Background() for the zero Call.
func (c Call) Context() context.Context {
	if c.ctx == nil {
		return context.Background()
	}
	return c.ctx
}

// Done gives back the call's InFlight permit (or its place in this
// process's count while Redis could not answer), bounded by Policy.Timeout
// even if Enter's ctx has ended; a permit whose release fails comes back
// when its lease ends. Only the first Done of a Call and its copies does
// anything; on a Call that holds nothing (no InFlight, not admitted, the
// zero Call) it does nothing.
func (c Call) Done() {
	if h := c.held; h != nil {
		h.once.Do(func() { h.g.leave(h.parent, h.s) })
	}
}

// A verdict is what Enter does with a call AllowN decided; the zero
// value, undecided, lets nothing through.
type verdict int

const (
	undecided verdict = iota // refused with the error
	admitted                 // let through, once it holds its InFlight slot
	denied                   // denied by the rules (or the fallback)
)

// judge is the verdict on the decision d and the error err of AllowN.
func (g *Guard) judge(d Decision, err error) verdict {
	switch {
	case errors.Is(err, ErrInvalidKey), errors.Is(err, funnel.ErrInvalidN):
		return undecided
	case d.Allowed || g.p.Shadow:
		return admitted
	case g.failingClosed(d, err):
		return undecided
	case err != nil && !d.Degraded: // the request's context ended
		return undecided
	}
	return denied
}

// failingClosed reports whether the denial d stands for a refusal of Redis,
// or for an answer Redis could not give and no fallback replaced.
func (g *Guard) failingClosed(d Decision, err error) bool {
	return errors.Is(err, ErrRejected) || d.Degraded && g.fb == nil && g.local == nil
}
