package guard

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/nilcheck"
	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/funnelguard/funnelguard/mutex"
)

// A Guard decides, for one endpoint, whether a call for a key may go ahead.
// It is safe for concurrent use; build it once with New.
type Guard struct {
	p     Policy
	lim   *funnel.Limiter
	fb    *fallback     // nil without Policy.Fallback
	local *funnel.Local // FailOpen without a Fallback: the rules, in-process
	// flights counts the calls running in this process for InFlight while
	// Redis cannot answer; nil unless InFlight is set and the guard fails
	// open (FailOpen or a Fallback).
	flights *flights
	// watch ends calls at once while Redis refuses connections (nil for a
	// client other than *redis.Client: see internal/outage), and tells when
	// to detour (detour.go).
	watch  *outage.Watch
	detour detour
	// permit is how an InFlight permit is held: InFlightLease, renewed.
	permit []mutex.Option
}

// Decision is the outcome of Allow.
type Decision struct {
	// Allowed reports whether the call may go ahead.
	Allowed bool
	// RetryAfter is, when denied, how long until the call would be admitted
	// by every rule; 0 when allowed.
	RetryAfter time.Duration
	// Rule names the rule that denied; when several deny, the one that
	// admits the call last (its wait is RetryAfter; the first of
	// Policy.Rules among equal waits). Empty when allowed.
	Rule string
	// Remaining is how many more calls the tightest rule, named Tightest,
	// admits right now: the rule with the fewest units left (among several,
	// the one that is empty last).
	Remaining int64
	Tightest  string
	// ResetAfter is how long until every rule's funnel is empty.
	ResetAfter time.Duration
	// TightestReset is how long until the Tightest rule alone is empty (a
	// funnel drained, a window's newest unit gone): the t of the RateLimit
	// field of an admission.
	TightestReset time.Duration
	// Degraded reports a decision made without Redis: by OnError, the
	// Fallback, or (FailOpen) the rules applied in this process; or a denial
	// because Redis refused the call (ErrRejected).
	Degraded bool
}

// Observation is what Policy.Observe receives after each decision: enough
// for metrics and traces, and never the key itself.
type Observation struct {
	Prefix   string // the guard's
	Plan     string // the key's plan (Policy.Plans), "" for Rules
	N        int64
	Decision Decision
	Err      error
	Latency  time.Duration
	// Shadow is set when the Policy is in shadow mode (Policy.Shadow): a
	// denial here blocked nothing.
	Shadow bool
	// Permit is set when the rules admitted a call of Do, Enter or
	// Middleware under Policy.InFlight, which then waited PermitWait for
	// a permit of its key (Latency includes it). A call that got none has
	// the refusal as its Decision and the permit's error as Err (ErrBusy:
	// none free within Timeout), not the admission.
	Permit     bool
	PermitWait time.Duration
}

// New returns a Guard for the Policy p on client, with a funnel.Limiter of
// its own made with p.Funnel. The rules and options are checked here: a bad
// Policy (a nil client among them) is an error matching ErrInvalidPolicy,
// and the funnel's error.
func New(client mutex.Client, p Policy) (*Guard, error) {
	if nilcheck.IsNil(client) {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidPolicy)
	}
	p, err := p.check()
	if err != nil {
		return nil, err
	}
	if err := funnel.Validate(p.Rules...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPolicy, err)
	}
	// A Limiter that can never decide would make every call fail: under
	// FailOpen, an admission for everyone. funnel.New refuses it here.
	lim, err := funnel.New(client, funnelOptions(p)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPolicy, err)
	}
	// A WAIT as long as the call's bound would turn every admission a
	// lagging replica holds up into ErrUnavailable.
	if n, d := lim.Locker().ReplicaAck(); n > 0 && d >= p.Timeout {
		return nil, fmt.Errorf("%w: replica acknowledgement within %v: want it under Timeout %v", ErrInvalidPolicy, d, p.Timeout)
	}
	if err := checkInFlight(lim.Locker(), p.InFlight); err != nil {
		return nil, err
	}
	g := &Guard{p: p, lim: lim, watch: outage.For(client, p.Timeout),
		permit: []mutex.Option{mutex.WithTTL(p.InFlightLease), mutex.WithAutoRenew()}}
	switch {
	case p.Fallback != nil:
		g.fb = newFallback(*p.Fallback)
	case p.OnError == FailOpen:
		g.local = funnel.NewLocal(DefaultFallbackMax)
	}
	if p.InFlight > 0 && (g.fb != nil || g.local != nil) {
		g.flights = newFlights(p.InFlight)
	}
	return g, nil
}

// funnelOptions are the options of the Limiters of a guard with Policy p.
func funnelOptions(p Policy) []funnel.Option {
	return append([]funnel.Option{funnel.WithPrefix(p.Prefix)}, p.Funnel...)
}

// funnelOptions are the options of g's Limiters.
func (g *Guard) funnelOptions() []funnel.Option { return funnelOptions(g.p) }

// checkInFlight refuses a negative InFlight, and one that l cannot keep
// (Locker.Semaphore refuses it).
func checkInFlight(l *mutex.Locker, n int64) error {
	switch {
	case n < 0:
		return fmt.Errorf("%w: InFlight %d: want 0 (no bound) or more", ErrInvalidPolicy, n)
	case n == 0:
		return nil
	}
	if _, err := l.Semaphore("k", n); err != nil {
		return fmt.Errorf("%w: InFlight %d: %w", ErrInvalidPolicy, n, err)
	}
	return nil
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (g *Guard) Allow(ctx context.Context, key string) (Decision, error) {
	return g.AllowN(ctx, key, 1)
}

// AllowN decides whether a call of n units for key may go ahead, and if so
// takes them from every rule.
//
// If Redis cannot answer within the Policy's Timeout, the Decision is the
// Fallback's, or else FailClosed's denial (RetryAfter = ErrorRetryAfter) or
// FailOpen's: the Policy's rules decided in this process (funnel.Local), so
// that each process admits at most what the rules allow per key, never
// everyone. It has Degraded set and comes with an error matching
// ErrUnavailable. If Redis answers with an error that will not go away by
// itself (no permission, out of memory, scripting disabled, a corrupt key),
// the call is denied whatever the Policy says, with an error matching
// ErrRejected. A bad key gives ErrInvalidKey and a denial; a ctx that ends
// gives ctx's error and a denial.
func (g *Guard) AllowN(ctx context.Context, key string, n int64) (Decision, error) {
	d, _, err := g.allowObserved(ctx, key, n)
	return d, err
}

// A keyed call is a call's stored key ("" when the key is invalid) and
// its plan.
type keyed struct {
	sk   string
	plan plan
}

// key returns the keyed call of key: its stored key and its plan.
func (g *Guard) key(ctx context.Context, key string) (keyed, error) {
	sk, err := g.storedKey(key)
	if err != nil {
		return keyed{}, err
	}
	p, err := g.planOf(ctx, key)
	return keyed{sk: sk, plan: p}, err
}

// allowObserved is AllowN that also returns the keyed call.
func (g *Guard) allowObserved(ctx context.Context, key string, n int64) (Decision, keyed, error) {
	d, k, _, err, ob := g.allowPending(ctx, key, n)
	ob.report(g)
	return d, k, err
}

// A pending Observation is reported (report) once the call's permit, if it
// takes one, is known, with the Latency since start.
type pending struct {
	o     Observation
	start time.Time         // zero for a nil ctx: nothing to report
	end   func(Observation) // Policy.Trace's, called once
}

// report passes p's Observation to Policy.Observe and to the end of its
// Policy.Trace.
func (p *pending) report(g *Guard) {
	if p.start.IsZero() || g.p.Observe == nil && p.end == nil {
		return
	}
	p.o.Latency = time.Since(p.start)
	if g.p.Observe != nil {
		g.p.Observe(p.o)
	}
	if end := p.end; end != nil {
		p.end = nil
		end(p.o)
	}
}

// waited records in p the wait for an InFlight permit since t0, and, if
// the call got none (err, not under Shadow), its refusal d.
func (p *pending) waited(g *Guard, t0 time.Time, d Decision, err error) {
	if g.p.InFlight == 0 {
		return
	}
	p.o.Permit, p.o.PermitWait = true, time.Since(t0)
	if err != nil && !g.p.Shadow {
		p.o.Decision, p.o.Err = d, err
	}
}

// allowPending is AllowN that also returns the keyed call, for Enter, Do
// and Middleware's RateLimit fields, the decision's context (Policy.Trace's,
// or ctx), in which the call waits for its permit, and the Observation to
// report.
func (g *Guard) allowPending(ctx context.Context, key string, n int64) (Decision, keyed, context.Context, error, *pending) {
	if ctx == nil {
		return Decision{}, keyed{}, nil, ErrNilContext, &pending{}
	}
	var end func(Observation)
	if g.p.Trace != nil {
		ctx, end = g.trace(ctx, key)
	}
	start := time.Now()
	k, err := g.key(ctx, key)
	var d Decision
	switch {
	case err == nil:
		d, err = g.allow(ctx, k, n)
	case errors.Is(err, ErrPlan):
		d = Decision{RetryAfter: g.p.ErrorRetryAfter}
	}
	return d, k, ctx, err, &pending{start: start, end: end,
		o: Observation{Prefix: g.p.Prefix, Plan: k.plan.name, N: n, Decision: d, Err: err, Shadow: g.p.Shadow}}
}

// trace starts the decision of a call for key in ctx with Policy.Trace,
// and returns the decision's context and the hook's end.
func (g *Guard) trace(ctx context.Context, key string) (context.Context, func(Observation)) {
	tctx, end := g.p.Trace(ctx, key)
	if tctx == nil {
		tctx = ctx
	}
	return tctx, end
}

// allow decides for the keyed call k.
func (g *Guard) allow(ctx context.Context, k keyed, n int64) (Decision, error) {
	var res funnel.Result
	err := g.decide(ctx, func(cctx context.Context, lim *funnel.Limiter) (err error) {
		res, err = lim.AllowN(cctx, k.sk, n, k.plan.rules...)
		return err
	})
	if err == nil {
		return decision(res), nil
	}
	if errors.Is(err, funnel.ErrInvalidN) || ctx.Err() != nil {
		return Decision{}, err
	}
	if !unanswered(err) {
		return Decision{RetryAfter: g.p.ErrorRetryAfter, Degraded: true}, fmt.Errorf("%w: %w", ErrRejected, err)
	}
	uerr := fmt.Errorf("%w: %w", ErrUnavailable, err)
	switch {
	case g.fb != nil:
		ok, wait := g.fb.allow(k.sk, n)
		return Decision{Allowed: ok, RetryAfter: wait, Degraded: true}, uerr
	case g.local != nil:
		res, lerr := g.local.AllowN(time.Now(), k.sk, n, k.plan.rules...)
		if lerr != nil { // the rules passed New's checks: n is the only cause
			return Decision{RetryAfter: g.p.ErrorRetryAfter, Degraded: true}, errors.Join(uerr, lerr)
		}
		d := decision(res)
		d.Degraded = true
		return d, uerr
	}
	return Decision{RetryAfter: g.p.ErrorRetryAfter, Degraded: true}, uerr
}

// Peek reports what Allow would decide for key now, taking nothing: for
// example, after an admission, how long until the next call is admitted
// (RetryAfter). If Redis cannot answer it returns an error matching
// ErrUnavailable and a denial.
func (g *Guard) Peek(ctx context.Context, key string) (Decision, error) {
	if ctx == nil {
		return Decision{}, ErrNilContext
	}
	k, err := g.key(ctx, key)
	if err != nil {
		return Decision{}, err
	}
	var res funnel.Result
	err = g.decide(ctx, func(cctx context.Context, lim *funnel.Limiter) (err error) {
		res, err = lim.Peek(cctx, k.sk, k.plan.rules...)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return Decision{}, err
		}
		return Decision{RetryAfter: g.p.ErrorRetryAfter, Degraded: true}, redisError(err)
	}
	return decision(res), nil
}

func decision(res funnel.Result) Decision {
	return Decision{Allowed: res.Allowed, RetryAfter: res.RetryAfter, Rule: res.Rule,
		Remaining: res.Remaining, Tightest: res.Tightest, ResetAfter: res.ResetAfter, TightestReset: res.TightestReset}
}

// Refund gives one unit back to every rule for key: the call was admitted
// but did not happen (the provider refused the message).
func (g *Guard) Refund(ctx context.Context, key string) error {
	return g.RefundN(ctx, key, 1)
}

// RefundN gives n units back to every rule for key, never below empty.
func (g *Guard) RefundN(ctx context.Context, key string, n int64) error {
	if ctx == nil {
		return ErrNilContext
	}
	k, err := g.key(ctx, key)
	if err != nil {
		return err
	}
	return g.refund(ctx, k, n)
}

// refund is RefundN for the keyed call k.
func (g *Guard) refund(ctx context.Context, k keyed, n int64) error {
	err := g.decide(ctx, func(cctx context.Context, lim *funnel.Limiter) error {
		return lim.Refund(cctx, k.sk, n, k.plan.rules...)
	})
	if err != nil {
		if errors.Is(err, funnel.ErrInvalidN) || ctx.Err() != nil {
			return err
		}
		return redisError(err)
	}
	return nil
}

// call runs f, a call to Redis, bounded by Timeout and watched: while
// Redis refuses connections it ends at once with an error matching
// mutex.ErrUnreachable (see internal/outage).
func (g *Guard) call(ctx context.Context, f func(context.Context) error) error {
	return g.watch.Run(ctx, g.p.Timeout, f)
}

// redisError wraps an error of a call to Redis: ErrUnavailable when Redis
// could not answer, ErrRejected when it refused.
func redisError(err error) error {
	if unanswered(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", ErrRejected, err)
}

// Do runs fn if Allow admits the call for key, and refunds the unit when fn
// returns an error; fn does not run when the call is denied. It returns the
// decision and fn's error (joined with the refund's, if that failed too), or
// Allow's error. A Degraded admission (FailOpen, a Fallback) took nothing
// in Redis: a failing fn refunds nothing there either.
//
// With Policy.InFlight, fn runs holding a permit of key's semaphore, given
// back when fn returns or panics, and its context is cancelled if the
// permit is lost. An admitted call that gets no permit within Timeout does
// not run: Do refunds its unit and returns a denial (RetryAfter
// ErrorRetryAfter) with an error matching ErrBusy (or ErrUnavailable,
// ErrRejected: see Policy.InFlight).
func (g *Guard) Do(ctx context.Context, key string, fn func(context.Context) error) (Decision, error) {
	d, k, dctx, err, ob := g.allowPending(ctx, key, 1)
	if !d.Allowed {
		ob.report(g)
		return d, err
	}
	t0 := time.Now()
	s, serr := g.enter(dctx, k.sk, d.Degraded)
	if serr != nil {
		bd := g.busyDecision(serr)
		ob.waited(g, t0, bd, serr)
		rerr := g.giveBack(dctx, k, d, 1)
		ob.report(g)
		return bd, errors.Join(serr, rerr)
	}
	ob.waited(g, t0, d, nil)
	ob.report(g)
	defer g.leave(ctx, s)
	err = errors.Join(err, s.degraded)
	if ferr := fn(s.context(ctx)); ferr != nil {
		rerr := g.giveBack(ctx, k, d, 1)
		if rerr == nil && err == nil {
			return d, ferr
		}
		return d, errors.Join(ferr, rerr, err)
	}
	return d, err
}

// giveBack refunds the n units the admission d of the keyed call k took
// in Redis (none when d was Degraded), for a call that did not happen,
// whatever happened to ctx.
func (g *Guard) giveBack(ctx context.Context, k keyed, d Decision, n int64) error {
	if d.Degraded || !d.Allowed {
		return nil
	}
	return g.refund(context.WithoutCancel(ctx), k, n)
}

// storedKey maps a caller's key to the key kept in Redis: normalized, then
// "k:" and the key itself, or "h:" and a SHA-256 of a long key, or "m:" and
// an HMAC with Policy.Secret. The three forms cannot collide, and the funnel
// escapes braces, so no key can reach another key's state or cluster slot.
func (g *Guard) storedKey(key string) (string, error) {
	if len(key) > MaxKeyLen {
		return "", fmt.Errorf("%w: %d bytes (at most %d)", ErrInvalidKey, len(key), MaxKeyLen)
	}
	if g.p.Normalize != nil {
		nk, err := g.p.Normalize(key)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrInvalidKey, err)
		}
		key = nk
	}
	if key == "" || len(key) > MaxKeyLen {
		return "", fmt.Errorf("%w: %d bytes (want 1 to %d)", ErrInvalidKey, len(key), MaxKeyLen)
	}
	switch {
	case len(g.p.Secret) > 0:
		m := hmac.New(sha256.New, g.p.Secret)
		m.Write([]byte(key))
		return "m:" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)), nil
	case len(key) > maxPlainKey:
		sum := sha256.Sum256([]byte(key))
		return "h:" + base64.RawURLEncoding.EncodeToString(sum[:]), nil
	}
	return "k:" + key, nil
}
