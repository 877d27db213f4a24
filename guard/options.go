package guard

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/mutex"
)

// FailureMode says what a Guard decides when Redis cannot answer.
type FailureMode int

const (
	// FailClosed denies (the default: an SMS costs money).
	FailClosed FailureMode = iota
	// FailOpen decides with the guard's rules in this process's memory
	// (funnel.Local, up to DefaultFallbackMax keys), unless WithFallback is
	// set: a fleet of N processes admits at most N times the rules' bound.
	FailOpen
)

// Defaults of a Guard's options.
const (
	DefaultPrefix      = "fg:guard:"
	DefaultTimeout     = 500 * time.Millisecond
	DefaultErrorRetry  = time.Second
	DefaultFallbackMax = 10000
	// DefaultInFlightLease is the lease of an InFlight permit.
	DefaultInFlightLease = 3 * time.Second
	// MinInFlightLease is the shortest WithInFlightLease: below it a
	// pause or a busy server would lose the permits of running calls.
	MinInFlightLease = 100 * time.Millisecond
	// MaxKeyLen is the longest key a Guard accepts, in bytes.
	MaxKeyLen = 4096
	// maxPlainKey is the longest key stored as it is; longer ones are hashed.
	maxPlainKey = 128
)

// An Option configures a Guard in New. Options apply in order: a later one
// replaces what an earlier one set, but WithFunnel adds to it. The funcs
// an Option is given must be fast and safe for concurrent use.
type Option func(*config) error

// config is a Guard's settings, as its Options (below) set them.
type config struct {
	Prefix                                  string
	Rules                                   []funnel.Rule
	OnError                                 FailureMode
	Timeout, ErrorRetryAfter, InFlightLease time.Duration
	InFlight                                int64
	Normalize                               func(key string) (string, error)
	Secret                                  []byte
	Fallback                                *Fallback // nil: WithOnError's mode decides
	Observe                                 func(Observation)
	Trace                                   func(ctx context.Context, key string) (context.Context, func(Observation))
	Plans                                   map[string][]funnel.Rule
	PlanOf                                  func(ctx context.Context, key string) (string, error)
	Funnel                                  []funnel.Option // funnel.WithPrefix(Prefix) first
	RateLimitHeaders, Shadow                bool
}

// configure applies opts in order, fills in and checks what they leave,
// and makes the rules plan "", sharing states with the plans' (plans.go).
func configure(opts []Option) (config, error) {
	c := config{Prefix: DefaultPrefix}
	for i, o := range opts {
		if o == nil {
			return c, fmt.Errorf("%w: option %d is nil", ErrInvalidOption, i)
		}
		if err := o(&c); err != nil {
			return c, err
		}
	}
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.ErrorRetryAfter = cmp.Or(c.ErrorRetryAfter, DefaultErrorRetry)
	c.InFlightLease = cmp.Or(c.InFlightLease, DefaultInFlightLease)
	switch {
	case min(c.Timeout, c.ErrorRetryAfter) < 0:
		return c, fmt.Errorf("%w: negative Timeout or ErrorRetryAfter", ErrInvalidOption)
	case c.InFlightLease < MinInFlightLease || c.InFlightLease > mutex.MaxTTL:
		return c, fmt.Errorf("%w: InFlightLease %v: want %v to %v (or 0 for %v)", ErrInvalidOption, c.InFlightLease, MinInFlightLease, mutex.MaxTTL, DefaultInFlightLease)
	case len(c.Rules) == 0:
		return c, fmt.Errorf("%w: no rules (with WithPlans too, WithRules decide the keys whose plan is \"\")", ErrInvalidOption)
	case c.PlanOf != nil:
		c.Rules = sharing(c.Rules)
		c.Plans[""] = c.Rules
	}
	c.Funnel = append([]funnel.Option{funnel.WithPrefix(c.Prefix)}, c.Funnel...)
	return c, nil
}

func set(f func(*config)) Option {
	return func(c *config) error { f(c); return nil }
}

// checked is set(f) if ok, else an Option that fails with ErrInvalidOption
// and why.
func checked(ok bool, why string, f func(*config)) Option {
	if !ok {
		return func(*config) error { return fmt.Errorf("%w: %s", ErrInvalidOption, why) }
	}
	return set(f)
}

// WithPrefix namespaces the guard's keys in Redis (DefaultPrefix if unset
// or empty): guards with different prefixes never share state.
func WithPrefix(prefix string) Option {
	prefix = cmp.Or(prefix, DefaultPrefix)
	err := keyspace.CheckPrefix(prefix)
	return checked(err == nil, fmt.Sprintf("prefix %q: %v", prefix, err), func(c *config) { c.Prefix = prefix })
}

// WithRules sets the rules decided all or nothing on every call (at least
// one; New refuses a guard without); with WithPlans, for the keys whose
// plan is "".
func WithRules(rules ...funnel.Rule) Option {
	rules = slices.Clone(rules) // the caller may reuse its slice
	return set(func(c *config) { c.Rules = rules })
}

// WithOnError sets what to decide when Redis cannot answer: FailClosed
// (the default) or FailOpen. ErrRejected always denies.
func WithOnError(mode FailureMode) Option {
	return checked(mode == FailClosed || mode == FailOpen, fmt.Sprintf("OnError %d", mode), func(c *config) { c.OnError = mode })
}

// WithErrorRetryAfter sets the RetryAfter of a denial because Redis could
// not answer, and of ErrBusy (DefaultErrorRetry if unset or zero).
func WithErrorRetryAfter(d time.Duration) Option {
	return set(func(c *config) { c.ErrorRetryAfter = d })
}

// WithTimeout bounds every call to Redis, lock waits included
// (DefaultTimeout if unset or zero).
func WithTimeout(d time.Duration) Option {
	return set(func(c *config) { c.Timeout = d })
}

// WithInFlight, if n is positive, bounds the calls of one key that run at
// once across the fleet: Do, Middleware and Enter hold a permit of the
// key's mutex.Semaphore (on the funnel's Locker) while the call runs. One
// that finds none waits in FIFO order for the Timeout, then is refused
// with ErrBusy, its units given back; its context is cancelled if its
// permit is lost. A negative n, or a Locker that cannot keep semaphores,
// is ErrInvalidOption; guards sharing a key's semaphore must agree on n,
// else ErrRejected. When Redis cannot answer, FailClosed refuses the call
// (ErrUnavailable); FailOpen and a Fallback count InFlight per process.
func WithInFlight(n int64) Option {
	return checked(n >= 0, fmt.Sprintf("InFlight %d: want 0 (no bound) or more", n), func(c *config) { c.InFlight = n })
}

// WithInFlightLease sets the lease of a WithInFlight permit
// (DefaultInFlightLease if unset or zero; MinInFlightLease to
// mutex.MaxTTL), renewed while the call runs: a killed process's permits
// are back about a lease later.
func WithInFlightLease(d time.Duration) Option {
	return set(func(c *config) { c.InFlightLease = d })
}

// WithNormalize makes the guard map every key to its canonical form (a
// phone number to E.164) with normalize first; its error rejects the key
// with ErrInvalidKey.
func WithNormalize(normalize func(key string) (string, error)) Option {
	return set(func(c *config) { c.Normalize = normalize })
}

// WithSecret makes the guard store HMAC-SHA256(secret, key), not the key.
// Keys over 128 bytes are always stored hashed.
func WithSecret(secret []byte) Option {
	return set(func(c *config) { c.Secret = secret })
}

// WithFallback makes the guard decide with f, a token bucket per key in
// this process, while Redis cannot answer, instead of WithOnError's mode.
// A bucket that cannot admit, or a Limit that is NaN, is ErrInvalidOption.
func WithFallback(f Fallback) Option {
	bad := !(f.Limit > 0) || f.Burst <= 0 || f.MaxKeys < 0 // !(> 0): NaN is bad too
	f.MaxKeys = cmp.Or(f.MaxKeys, DefaultFallbackMax)      // here: an Option may serve many News at once
	return checked(!bad, "Fallback needs a positive Limit and Burst", func(c *config) { c.Fallback = &f })
}

// WithObserve makes the guard call observe after every decision, once its
// InFlight permit is known.
func WithObserve(observe func(Observation)) Option {
	return set(func(c *config) { c.Observe = observe })
}

// WithTrace makes the guard call trace as every decision starts (Allow,
// AllowN, Do, Enter, Middleware; not Peek or Refund), with the caller's
// ctx and key (before WithNormalize: never for a span or a log). The
// decision runs in the context trace returns, which must derive from ctx
// (nil is ctx); end, if not nil, is called once with the Observation. The
// call itself, its refund and release run in the caller's ctx.
func WithTrace(trace func(ctx context.Context, key string) (_ context.Context, end func(Observation))) Option {
	return set(func(c *config) { c.Trace = trace })
}

// WithPlans sets rule sets by name ("free", "pro"): planOf names the plan
// of each call's key, as the caller gave it, and the plan's rules decide
// the call instead of WithRules' (plan ""). An error of planOf, or a name
// not in plans, refuses the call with ErrPlan (Middleware: 503). A changed
// plan takes effect on the key's next call, with what it took kept: the
// rules of one kind and period share one state across the plans
// (funnel.Rule.Sharing). plans and planOf go together.
func WithPlans(plans map[string][]funnel.Rule, planOf func(ctx context.Context, key string) (string, error)) Option {
	return func(c *config) error {
		if (planOf == nil) != (len(plans) == 0) {
			return fmt.Errorf("%w: the plans and planOf of WithPlans go together", ErrInvalidOption)
		}
		c.Plans, c.PlanOf = make(map[string][]funnel.Rule, len(plans)), planOf
		for name, rules := range plans {
			if err := checkPlan(name, rules); err != nil {
				return err
			}
			c.Plans[name] = sharing(rules)
		}
		return nil
	}
}

// WithFunnel adds options of the guard's funnel.Limiter, applied after
// funnel.WithPrefix(the guard's prefix); a bad one is ErrInvalidOption and
// funnel.ErrInvalidOption. WithReplicaAck's wait must be under the
// Timeout; WithLocker's Locker holds the InFlight semaphores too.
func WithFunnel(opts ...funnel.Option) Option {
	opts = slices.Clone(opts)
	return set(func(c *config) { c.Funnel = append(c.Funnel, opts...) })
}

// WithRateLimitHeaders makes Middleware send the RateLimit-Policy and
// RateLimit fields (draft-ietf-httpapi-ratelimit-headers-11), off by
// default since they disclose the quota: each rule's q units in w seconds
// (funnel.Rule.Quota), and r and t of one rule, with a pk that names the
// key's partition without telling it.
func WithRateLimitHeaders() Option {
	return set(func(c *config) { c.RateLimitHeaders = true })
}

// WithShadow makes the guard decide, count and observe every call but
// block none: Middleware and Enter let denied calls through (the real
// Decision in FromContext, Call.Decision), and each Observation has Shadow
// set. Allow and AllowN return the real Decision. For rolling a limit out.
func WithShadow() Option {
	return set(func(c *config) { c.Shadow = true })
}
