package guard

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/mutex"
	"golang.org/x/time/rate"
)

// FailureMode says what a Guard decides when Redis cannot answer.
type FailureMode int

const (
	// FailClosed denies (the default: an SMS costs money).
	FailClosed FailureMode = iota
	// FailOpen decides with the Policy's rules in this process's memory
	// (funnel.Local, up to DefaultFallbackMax keys), unless a Fallback is
	// set: a fleet of N processes admits at most N times the rules' bound
	// per key, on top of what Redis counted before, never everyone.
	FailOpen
)

// Defaults of a Policy.
const (
	DefaultPrefix      = "fg:guard:"
	DefaultTimeout     = 500 * time.Millisecond
	DefaultErrorRetry  = time.Second
	DefaultFallbackMax = 10000
	// DefaultInFlightLease is the lease of an InFlight permit: a send of
	// 0.1 to 2 s makes no renewal, and a dead process's slots are free in
	// about 3 s, before a "resend in N s" countdown ends.
	DefaultInFlightLease = 3 * time.Second
	// MinInFlightLease is the shortest Policy.InFlightLease: below it a
	// pause or a busy server would lose the permits of running calls.
	MinInFlightLease = 100 * time.Millisecond
	// MaxKeyLen is the longest key a Guard accepts, in bytes.
	MaxKeyLen = 4096
	// maxPlainKey is the longest key stored as it is; longer ones are hashed.
	maxPlainKey = 128
)

// A Policy configures a Guard. Its funcs must be fast and safe for
// concurrent use.
type Policy struct {
	// Prefix namespaces the guard's keys in Redis (DefaultPrefix if
	// empty): guards with different prefixes never share state.
	Prefix string
	// Rules are decided all or nothing on every call (at least one); with
	// Plans, for the keys whose plan is "".
	Rules []funnel.Rule
	// OnError is what to decide when Redis cannot answer: FailClosed (the
	// zero value) or FailOpen. ErrRejected always denies.
	OnError FailureMode
	// ErrorRetryAfter is the RetryAfter of a denial because Redis could not
	// answer, and of ErrBusy (DefaultErrorRetry if zero).
	ErrorRetryAfter time.Duration
	// Timeout bounds every call to Redis, lock waits included
	// (DefaultTimeout if zero).
	Timeout time.Duration
	// InFlight, if positive, bounds the calls of one key that run at once
	// across the fleet: Do, Middleware and Enter hold a permit of the key's
	// mutex.Semaphore (on the funnel's Locker, in the key's cluster slot)
	// while the call runs, two round trips a call. One that finds none
	// waits in FIFO order for Timeout, then is refused with ErrBusy, its
	// units given back. The call's context is cancelled if its permit is
	// lost. Allow and AllowN take no permit. Negative, or on a Locker that
	// cannot keep semaphores, is ErrInvalidPolicy. Guards sharing a key's
	// semaphore (one Prefix or Locker) must agree on InFlight, else
	// ErrRejected. When Redis cannot answer, FailClosed refuses the call
	// (ErrUnavailable); FailOpen and a Fallback count InFlight per process.
	InFlight int64
	// InFlightLease is the lease of an InFlight permit (DefaultInFlightLease
	// if zero; MinInFlightLease to mutex.MaxTTL), renewed every third of it
	// while the call runs; a permit none of whose renewals lands in time is
	// lost. A killed process's permits, and its waiters' places, are back
	// within 3 retry intervals of its Locker plus InFlightLease (3.15 s by
	// default).
	InFlightLease time.Duration
	// Normalize, if set, maps a key to its canonical form (a phone number
	// to E.164) first; its error rejects the key with ErrInvalidKey.
	Normalize func(key string) (string, error)
	// Secret, if set, makes the guard store HMAC-SHA256(Secret, key), not
	// the key. Keys over 128 bytes are always stored hashed.
	Secret []byte
	// Fallback, if set, decides with a token bucket per key in this
	// process while Redis cannot answer, instead of OnError.
	Fallback *Fallback
	// Observe, if set, is called after every decision, once its InFlight
	// permit is known.
	Observe func(Observation)
	// Trace, if set, is called as every decision starts (Allow, AllowN,
	// Do, Enter, Middleware), with the caller's ctx and key (before
	// Normalize: for a hash of its own, never for a span or a log). Its
	// Redis commands, PlanOf and the permit's wait run in the context it
	// returns, which must derive from ctx (its deadline bounds the
	// decision on a hung server; nil is ctx); end, if not nil, is called
	// once with the Observation. The call itself (fn, the handler,
	// Call.Context), its refund and release run in the caller's ctx. A nil
	// ctx is ErrNilContext first. Peek and Refund are not traced.
	Trace func(ctx context.Context, key string) (_ context.Context, end func(Observation))
	// Plans, if set, are rule sets by name ("free", "pro"): PlanOf names
	// each call's plan, whose rules decide it instead of Rules (plan "").
	// A changed plan takes effect on the key's next call, with what it
	// took kept: the rules of every plan of one kind and period (and zone)
	// share one state, in whatever order the plans list them
	// (funnel.Rule.Sharing), and names do not part it. A plan's rules keep
	// no gate in Redis: each call after the first takes two round trips.
	Plans map[string][]funnel.Rule
	// PlanOf names the plan of key, as the caller gave it, on every call
	// ("" is Rules). Its error, or a name not in Plans, refuses the call
	// with ErrPlan (Middleware: 503). Plans and PlanOf go together.
	PlanOf func(ctx context.Context, key string) (string, error)
	// Funnel are options of the guard's funnel.Limiter, after
	// funnel.WithPrefix(Prefix); a bad one is ErrInvalidPolicy and
	// funnel.ErrInvalidOption. WithDenyCache denies a denied key in
	// process until its gate time (a Refund through this Guard clears it);
	// WithUniformCost hides which keys are new; WithPenalty boxes a key its
	// rules keep denying; WithReplicaAck's wait must be under Timeout (its
	// failure is OnError's); WithLocker's Locker takes the keys' locks and
	// InFlight semaphores, shared by the guards that share it.
	Funnel []funnel.Option
	// RateLimitHeaders makes Middleware send the RateLimit-Policy and
	// RateLimit fields (draft-ietf-httpapi-ratelimit-headers-11), off by
	// default since they disclose the quota: each rule's q units in w
	// seconds (funnel.Rule.Quota: a funnel counts its burst and what leaks
	// within w), and r and t of one rule, with pk naming the key's
	// partition without telling it:
	//
	//	RateLimit-Policy: "1/1m0s";q=1;w=60, "5 in 1h0m0s";q=5;w=3600
	//	RateLimit: "1/1m0s";r=0;t=60;pk=:...:
	RateLimitHeaders bool
	// Shadow decides, counts and observes every call but blocks none:
	// Middleware and Enter let denied calls through (the real Decision in
	// FromContext, Call.Decision), and each Observation has Shadow set.
	// Allow and AllowN return the real Decision. For rolling a limit out.
	Shadow bool
}

// Fallback is a strict in-process limit per key for while Redis is down.
type Fallback struct {
	// Limit and Burst are the token bucket of each key (golang.org/x/time/rate).
	Limit rate.Limit
	Burst int
	// MaxKeys bounds the keys remembered (DefaultFallbackMax if zero); when
	// full, the oldest half is forgotten.
	MaxKeys int
}

// durations validates p's durations and fills in their defaults.
func (p Policy) durations() (Policy, error) {
	p.Timeout = cmp.Or(p.Timeout, DefaultTimeout)
	p.ErrorRetryAfter = cmp.Or(p.ErrorRetryAfter, DefaultErrorRetry)
	p.InFlightLease = cmp.Or(p.InFlightLease, DefaultInFlightLease)
	switch {
	case p.Timeout < 0 || p.ErrorRetryAfter < 0:
		return p, fmt.Errorf("%w: negative Timeout or ErrorRetryAfter", ErrInvalidPolicy)
	case p.InFlightLease < MinInFlightLease || p.InFlightLease > mutex.MaxTTL:
		return p, fmt.Errorf("%w: InFlightLease %v: want %v to %v (or 0 for %v)", ErrInvalidPolicy, p.InFlightLease, MinInFlightLease, mutex.MaxTTL, DefaultInFlightLease)
	}
	return p, nil
}

// check validates p and fills in its defaults.
func (p Policy) check() (Policy, error) {
	p.Prefix = cmp.Or(p.Prefix, DefaultPrefix)
	if why := p.invalid(); why != "" {
		return p, fmt.Errorf("%w: %s", ErrInvalidPolicy, why)
	}
	p, err := p.durations()
	if err != nil {
		return p, err
	}
	if f := p.Fallback; f != nil {
		fc := *f
		fc.MaxKeys = cmp.Or(fc.MaxKeys, DefaultFallbackMax)
		p.Fallback = &fc
	}
	// The caller may reuse its slices.
	p.Rules = append([]funnel.Rule(nil), p.Rules...)
	if p, err = p.checkPlans(); err != nil {
		return p, err
	}
	p.Funnel = append([]funnel.Option(nil), p.Funnel...)
	return p, nil
}

// invalid reports whether f, if set, is a bucket that cannot admit.
func (f *Fallback) invalid() bool {
	return f != nil && (f.Limit <= 0 || f.Burst <= 0 || f.MaxKeys < 0)
}

// invalid returns why p's prefix, rules, OnError, Fallback or InFlight
// cannot be used, "" if they can (durations and plans are checked apart).
func (p Policy) invalid() string {
	if err := keyspace.CheckPrefix(p.Prefix); err != nil {
		return fmt.Sprintf("prefix %q: %v", p.Prefix, err)
	}
	switch {
	case len(p.Rules) == 0 && len(p.Plans) > 0:
		return "no Rules: with Plans too, Rules decide the keys whose plan is \"\""
	case len(p.Rules) == 0:
		return "no rules"
	case p.OnError != FailClosed && p.OnError != FailOpen:
		return fmt.Sprintf("OnError %d", p.OnError)
	case p.Fallback.invalid():
		return "Fallback needs a positive Limit and Burst"
	case p.InFlight < 0:
		return fmt.Sprintf("InFlight %d: want 0 (no bound) or more", p.InFlight)
	}
	return ""
}
