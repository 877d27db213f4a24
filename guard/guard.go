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
	"github.com/funnelguard/funnelguard/mutex"
)

// A Guard decides, for one endpoint, whether a call for a key may go ahead.
// It is safe for concurrent use; build it once with New.
type Guard struct {
	p     Policy
	lim   *funnel.Limiter
	fb    *fallback     // nil without Policy.Fallback
	local *funnel.Local // FailOpen without a Fallback: the rules, in-process
}

// Decision is the outcome of Allow.
type Decision struct {
	// Allowed reports whether the call may go ahead.
	Allowed bool
	// RetryAfter is, when denied, how long until the call would be admitted
	// by every rule; 0 when allowed.
	RetryAfter time.Duration
	// Rule names the rule that denied; empty when allowed.
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
	N        int64
	Decision Decision
	Err      error
	Latency  time.Duration
	// Shadow is set when the Policy is in shadow mode (Policy.Shadow): a
	// denial here blocked nothing.
	Shadow bool
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
	lim, err := funnel.New(client, append([]funnel.Option{funnel.WithPrefix(p.Prefix)}, p.Funnel...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPolicy, err)
	}
	// A WAIT as long as the call's bound would turn every admission a
	// lagging replica holds up into ErrUnavailable.
	if n, d := lim.Locker().ReplicaAck(); n > 0 && d >= p.Timeout {
		return nil, fmt.Errorf("%w: replica acknowledgement within %v: want it under Timeout %v", ErrInvalidPolicy, d, p.Timeout)
	}
	g := &Guard{p: p, lim: lim}
	switch {
	case p.Fallback != nil:
		g.fb = newFallback(*p.Fallback)
	case p.OnError == FailOpen:
		g.local = funnel.NewLocal(DefaultFallbackMax)
	}
	return g, nil
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

// allowObserved is AllowN that also returns the stored key ("" when the
// key is invalid), for Middleware's RateLimit field.
func (g *Guard) allowObserved(ctx context.Context, key string, n int64) (Decision, string, error) {
	start := time.Now()
	sk, err := g.storedKey(key)
	var d Decision
	if err == nil {
		d, err = g.allow(ctx, sk, n)
	}
	if g.p.Observe != nil {
		g.p.Observe(Observation{Prefix: g.p.Prefix, N: n, Decision: d, Err: err, Latency: time.Since(start), Shadow: g.p.Shadow})
	}
	return d, sk, err
}

// allow decides for the stored key sk.
func (g *Guard) allow(ctx context.Context, sk string, n int64) (Decision, error) {
	cctx, cancel := context.WithTimeout(ctx, g.p.Timeout)
	defer cancel()
	res, err := g.lim.AllowN(cctx, sk, n, g.p.Rules...)
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
		ok, wait := g.fb.allow(sk, n)
		return Decision{Allowed: ok, RetryAfter: wait, Degraded: true}, uerr
	case g.local != nil:
		res, lerr := g.local.AllowN(time.Now(), sk, n, g.p.Rules...)
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
	sk, err := g.storedKey(key)
	if err != nil {
		return Decision{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, g.p.Timeout)
	defer cancel()
	res, err := g.lim.Peek(cctx, sk, g.p.Rules...)
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
	sk, err := g.storedKey(key)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, g.p.Timeout)
	defer cancel()
	if err := g.lim.Refund(cctx, sk, n, g.p.Rules...); err != nil {
		if errors.Is(err, funnel.ErrInvalidN) || ctx.Err() != nil {
			return err
		}
		return redisError(err)
	}
	return nil
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
func (g *Guard) Do(ctx context.Context, key string, fn func(context.Context) error) (Decision, error) {
	d, err := g.Allow(ctx, key)
	if !d.Allowed {
		return d, err
	}
	if ferr := fn(ctx); ferr != nil {
		if d.Degraded {
			return d, errors.Join(ferr, err)
		}
		if rerr := g.Refund(ctx, key); rerr != nil {
			return d, errors.Join(ferr, rerr)
		}
		return d, ferr
	}
	return d, err
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
