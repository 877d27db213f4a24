package guard

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/nilcheck"
	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/funnelguard/funnelguard/mutex"
)

// A Guard decides, for one endpoint, whether a call for a key may go ahead.
// It is safe for concurrent use; build it once with New.
type Guard struct {
	cfg  config
	lim  *funnel.Limiter
	open func(k keyed, n int64) (funnel.Result, error) // the Fallback or FailOpen's rules; nil failing closed
	// flights counts InFlight in this process while Redis cannot answer
	// (failing closed, only Shadow's calls, which run whatever the count says).
	flights *flights
	// watch ends calls at once while Redis refuses connections (nil but for
	// a *redis.Client), and says when to detour (detour.go).
	watch  *outage.Watch
	detour func() *funnel.Limiter // detourLimiter, made once (detour.go)
	permit []mutex.Option         // how an InFlight permit is held
}

// Decision is the outcome of Allow.
type Decision struct {
	// Allowed reports whether the call may go ahead.
	Allowed bool
	// RetryAfter is, when denied, how long until every rule would admit
	// the call; 0 when allowed.
	RetryAfter time.Duration
	// Rule names the rule that denied (of several, the one that admits
	// last; the first of WithRules among equal waits); "" when allowed.
	Rule string
	// Remaining is how many more calls the tightest rule, named Tightest
	// (the fewest units left; of several, the one empty last), admits now.
	Remaining int64
	Tightest  string
	// ResetAfter is how long until every rule's funnel is empty.
	ResetAfter time.Duration
	// TightestReset is how long until the Tightest rule alone is empty.
	TightestReset time.Duration
	// Degraded reports a decision made without Redis (OnError, the
	// Fallback, FailOpen's in-process rules), or a denial because Redis
	// refused the call (ErrRejected).
	Degraded bool
}

// Observation is what WithObserve receives after each decision; it
// never holds the key.
type Observation struct {
	Prefix   string // the guard's
	Plan     string // the key's plan (WithPlans), "" for Rules
	N        int64
	Decision Decision
	Err      error
	Latency  time.Duration
	// Shadow is set under WithShadow: a denial blocked nothing.
	Shadow bool
	// Permit is set when Do, Enter or Middleware waited PermitWait for an
	// InFlight permit after an admission (Latency includes it). A call
	// that got none has its refusal as Decision and the error as Err.
	Permit     bool
	PermitWait time.Duration
}

// New returns a Guard on client configured by opts (WithRules at least),
// with a funnel.Limiter of its own made with WithFunnel's options. A nil
// client, a nil or bad option is an error matching ErrInvalidOption (and
// the funnel's error, if any).
func New(client mutex.Client, opts ...Option) (*Guard, error) {
	if nilcheck.IsNil(client) {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOption)
	}
	c, err := configure(opts)
	if err != nil {
		return nil, err
	}
	// A Limiter that can never decide would make every call fail: under
	// FailOpen, an admission for everyone. funnel.New refuses it here.
	lim, err := funnel.New(client, c.Funnel...)
	if err = cmp.Or(funnel.Validate(c.Rules...), err); err != nil { // the rules' error first
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	if err := checkLocker(lim.Locker(), c); err != nil {
		return nil, err
	}
	g := &Guard{cfg: c, lim: lim, watch: outage.For(client, c.Timeout),
		flights: &flights{n: make(map[string]int64)},
		permit:  []mutex.Option{mutex.WithTTL(c.InFlightLease), mutex.WithAutoRenew()}}
	g.detour = sync.OnceValue(g.detourLimiter)
	switch {
	case c.Fallback != nil:
		g.open = newFallback(*c.Fallback).allow
	case c.OnError == FailOpen:
		local := funnel.NewLocal(DefaultFallbackMax)
		g.open = func(k keyed, n int64) (funnel.Result, error) {
			return local.AllowN(time.Now(), k.sk, n, k.rules...)
		}
	}
	return g, nil
}

// checkLocker refuses what c asks of l that l cannot keep: replica acks
// within Timeout (a WAIT as long would fail every admission a lagging
// replica holds up), or InFlight semaphores.
func checkLocker(l *mutex.Locker, c config) error {
	if _, d := l.ReplicaAck(); d >= c.Timeout { // d is 0 without acks, and Timeout positive
		return fmt.Errorf("%w: replica acknowledgement within %v: want it under Timeout %v", ErrInvalidOption, d, c.Timeout)
	}
	if c.InFlight == 0 {
		return nil
	}
	if _, err := l.Semaphore("k", c.InFlight); err != nil {
		return fmt.Errorf("%w: InFlight %d: %w", ErrInvalidOption, c.InFlight, err)
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
// If Redis cannot answer within Timeout, the Decision is Degraded, with an
// error matching ErrUnavailable: the Fallback's, FailOpen's or FailClosed's
// denial (RetryAfter ErrorRetryAfter). An answer that will not change
// denies whatever the options say, with ErrRejected. A bad key gives
// ErrInvalidKey, an ended ctx its error, each with a denial.
func (g *Guard) AllowN(ctx context.Context, key string, n int64) (Decision, error) {
	p := g.start(ctx, key, n)
	p.report(g)
	return p.d, p.err
}

// A keyed call is a call's stored key ("" when the key is invalid), and
// its plan's name and rules.
type keyed struct {
	sk    string
	plan  string // "" for WithRules
	rules []funnel.Rule
}

// key returns the keyed call of key; a nil ctx is ErrNilContext.
func (g *Guard) key(ctx context.Context, key string) (k keyed, err error) {
	if ctx == nil {
		return k, ErrNilContext
	}
	if k.sk, err = g.storedKey(key); err != nil {
		return keyed{}, err
	}
	k.plan, k.rules, err = g.planOf(ctx, key)
	return k, err
}

// A pending call is one AllowN decided, with what Do, Enter and Middleware
// need next, and its Observation, reported once its permit is known.
type pending struct {
	d     Decision
	err   error
	k     keyed
	ctx   context.Context // the decision's (WithTrace's), or the caller's
	o     Observation
	start time.Time         // zero for a nil ctx: nothing to report
	end   func(Observation) // WithTrace's
}

func (g *Guard) start(ctx context.Context, key string, n int64) *pending {
	if ctx == nil {
		return &pending{err: ErrNilContext}
	}
	p := &pending{ctx: ctx}
	if g.cfg.Trace != nil {
		var tctx context.Context
		tctx, p.end = g.cfg.Trace(ctx, key)
		p.ctx = cmp.Or(tctx, ctx)
	}
	p.start = time.Now()
	p.k, p.err = g.key(p.ctx, key)
	switch {
	case p.err == nil:
		p.d, p.err = g.allow(p.ctx, p.k, n)
	case errors.Is(p.err, ErrPlan):
		p.d = Decision{RetryAfter: g.cfg.ErrorRetryAfter}
	}
	p.o = Observation{Prefix: g.cfg.Prefix, Plan: p.k.plan, N: n, Decision: p.d, Err: p.err, Shadow: g.cfg.Shadow}
	return p
}

func (p *pending) report(g *Guard) {
	if p.start.IsZero() {
		return
	}
	p.o.Latency = time.Since(p.start)
	if g.cfg.Observe != nil {
		g.cfg.Observe(p.o)
	}
	if p.end != nil {
		p.end(p.o)
	}
}

// take takes the InFlight slot, if any, of p's admitted call; a call
// refused one gets d, the denial that stands for it, and its units back,
// unless shadow lets it run without (and no error). p's Observation records
// the wait, and the refusal; the error joins a failed refund's.
func (g *Guard) take(p *pending, shadow bool) (s slot, d Decision, err error) {
	if g.cfg.InFlight == 0 {
		return slot{}, p.d, nil
	}
	t0 := time.Now()
	s, err = g.enter(p.ctx, p.k.sk, p.d.Degraded)
	p.o.Permit, p.o.PermitWait = true, time.Since(t0)
	if err == nil || shadow {
		return s, p.d, nil
	}
	d = Decision{RetryAfter: g.cfg.ErrorRetryAfter, Degraded: errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRejected)}
	p.o.Decision, p.o.Err = d, err // the call does not run, Shadow or not
	return s, d, errors.Join(err, g.giveBack(p.ctx, p.k, p.d, p.o.N))
}

func (g *Guard) allow(ctx context.Context, k keyed, n int64) (Decision, error) {
	d, err := g.decide(ctx, func(cctx context.Context, lim *funnel.Limiter) (funnel.Result, error) {
		return lim.AllowN(cctx, k.sk, n, k.rules...)
	})
	if g.open == nil || !errors.Is(err, ErrUnavailable) {
		return d, err
	}
	res, oerr := g.open(k, n)
	if oerr != nil { // the rules passed New's checks: n is the only cause
		return d, errors.Join(err, oerr)
	}
	d = decision(res)
	d.Degraded = true
	return d, err
}

// Peek reports what Allow would decide for key now, taking nothing (after
// an admission, RetryAfter is the wait for the next). If Redis cannot
// answer it returns a denial and an error matching ErrUnavailable.
func (g *Guard) Peek(ctx context.Context, key string) (Decision, error) {
	k, err := g.key(ctx, key)
	if err != nil {
		return Decision{}, err
	}
	return g.decide(ctx, func(cctx context.Context, lim *funnel.Limiter) (funnel.Result, error) {
		return lim.Peek(cctx, k.sk, k.rules...)
	})
}

func decision(res funnel.Result) Decision {
	return Decision{Allowed: res.Allowed, RetryAfter: res.RetryAfter, Rule: res.Rule,
		Remaining: res.Remaining, Tightest: res.Tightest, ResetAfter: res.ResetAfter, TightestReset: res.TightestReset}
}

// Refund is shorthand for RefundN(ctx, key, 1): the call was admitted but
// did not happen (the provider refused the message).
func (g *Guard) Refund(ctx context.Context, key string) error {
	return g.RefundN(ctx, key, 1)
}

// RefundN gives n units back to every rule for key, never below empty.
func (g *Guard) RefundN(ctx context.Context, key string, n int64) error {
	k, err := g.key(ctx, key)
	if err != nil {
		return err
	}
	return g.refund(ctx, k, n)
}

func (g *Guard) refund(ctx context.Context, k keyed, n int64) error {
	_, err := g.decide(ctx, func(cctx context.Context, lim *funnel.Limiter) (funnel.Result, error) {
		return funnel.Result{}, lim.Refund(cctx, k.sk, n, k.rules...)
	})
	return err
}

// giveBack refunds what the admission d of k took in Redis (nothing if
// Degraded), whatever happened to ctx: the call did not happen.
func (g *Guard) giveBack(ctx context.Context, k keyed, d Decision, n int64) error {
	if d.Degraded {
		return nil
	}
	return g.refund(context.WithoutCancel(ctx), k, n)
}

// Do runs fn if Allow admits the call for key, and refunds the unit when fn
// returns an error. It returns the decision and fn's error (joined with a
// failed refund's), or Allow's error. A Degraded admission took nothing in
// Redis, and a failing fn refunds nothing there.
//
// With WithInFlight, fn runs holding a permit, given back when fn returns
// or panics; an admitted call refused one does not run, and Do returns a
// denial (RetryAfter ErrorRetryAfter) with the refusal's error.
func (g *Guard) Do(ctx context.Context, key string, fn func(context.Context) error) (Decision, error) {
	p := g.start(ctx, key, 1)
	s, d, err := slot{}, p.d, p.err
	if d.Allowed {
		s, d, err = g.take(p, false) // a refusal is a denial
	}
	p.report(g)
	if !d.Allowed {
		return d, err
	}
	defer g.leave(ctx, s)
	err = errors.Join(p.err, s.degraded)
	if ferr := fn(s.context(ctx)); ferr != nil {
		rerr := g.giveBack(ctx, p.k, d, 1)
		if rerr == nil && err == nil {
			return d, ferr
		}
		return d, errors.Join(ferr, rerr, err)
	}
	return d, err
}

// storedKey maps a caller's key to the key kept in Redis: normalized (one
// over MaxKeyLen is refused as it is), then "k:" and the key itself, or "h:"
// and a SHA-256 of a long key, or "m:" and an HMAC with WithSecret. The
// three forms cannot collide, and the funnel escapes braces, so no key can
// reach another key's state or cluster slot.
func (g *Guard) storedKey(key string) (string, error) {
	if g.cfg.Normalize != nil && len(key) <= MaxKeyLen {
		nk, err := g.cfg.Normalize(key)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrInvalidKey, err)
		}
		key = nk
	}
	switch {
	case key == "" || len(key) > MaxKeyLen:
		return "", fmt.Errorf("%w: %d bytes (want 1 to %d)", ErrInvalidKey, len(key), MaxKeyLen)
	case len(g.cfg.Secret) > 0:
		m := hmac.New(sha256.New, g.cfg.Secret)
		m.Write([]byte(key))
		return "m:" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)), nil
	case len(key) > maxPlainKey:
		sum := sha256.Sum256([]byte(key))
		return "h:" + base64.RawURLEncoding.EncodeToString(sum[:]), nil
	}
	return "k:" + key, nil
}
