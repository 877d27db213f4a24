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
	// (funnel.Local), unless a Fallback is set: each process then admits at
	// most what the rules allow per key (for up to DefaultFallbackMax keys;
	// older keys are forgotten when more come), so a fleet of N processes
	// admits at most N times the rules' bound while Redis is down, never
	// everyone. The in-process rules start empty: that bound comes on top of
	// what Redis counted before it stopped answering.
	FailOpen
)

// Defaults of a Policy.
const (
	DefaultPrefix      = "fg:guard:"
	DefaultTimeout     = 500 * time.Millisecond
	DefaultErrorRetry  = time.Second
	DefaultFallbackMax = 10000
	// DefaultInFlightLease is the lease of an InFlight permit unless
	// Policy.InFlightLease says otherwise, picked for one call of an
	// SMS-send endpoint: the provider's API answers in 0.1 to 2 s, rarely
	// in more than 10. The lease is renewed while the call runs, so it need
	// not cover the call; it is how long a process killed mid-call keeps
	// its slots, and its third is how often a running call renews. At 3 s a
	// call under 1 s (most sends) makes no renewal and a 10 s one makes 9
	// (one round trip each); a renewal has 1 s to land, twice
	// DefaultTimeout, before the permit may be lost; and a user whose send
	// died with its process finds the key's slots free within about 3 s,
	// less than any "resend in N s" countdown. A longer lease only keeps a
	// dead process's slots longer; a shorter one costs more renewals and
	// loses running calls' permits on shorter Redis stalls.
	DefaultInFlightLease = 3 * time.Second
	// MinInFlightLease is the shortest Policy.InFlightLease: renewals every
	// 33 ms, each with 33 ms to land. Below it, a garbage-collection pause
	// or a busy server would lose the permits of calls that still run.
	MinInFlightLease = 100 * time.Millisecond
	// MaxKeyLen is the longest key a Guard accepts, in bytes.
	MaxKeyLen = 4096
	// maxPlainKey is the longest key stored as it is; longer ones are hashed.
	maxPlainKey = 128
)

// A Policy configures a Guard.
type Policy struct {
	// Prefix namespaces the guard's keys in Redis ("sms:phone:", "sms:ip:");
	// DefaultPrefix if empty. Guards with different prefixes never share
	// state, whatever their keys.
	Prefix string
	// Rules are decided all or nothing on every call (at least one). With
	// Plans, they decide the keys whose plan is "" (give them even when
	// every key has a plan: a free plan's rules, say).
	Rules []funnel.Rule
	// OnError is what to decide when Redis cannot answer: FailClosed (the
	// zero value) or FailOpen. An answer that refuses the call (ErrRejected)
	// always denies.
	OnError FailureMode
	// ErrorRetryAfter is the RetryAfter of a denial made because Redis could
	// not answer, and of a call refused with ErrBusy (DefaultErrorRetry if
	// zero).
	ErrorRetryAfter time.Duration
	// Timeout bounds every call to Redis, lock waits included, so that a slow
	// Redis cannot stall an endpoint (DefaultTimeout if zero).
	Timeout time.Duration
	// InFlight, if positive, bounds the calls of one key that run at once,
	// across every process of the fleet: Do, Middleware and Enter hold one
	// permit of the key's semaphore of InFlight permits (a mutex.Semaphore on the
	// Locker of the guard's funnel, in the cluster slot of the key's lock and
	// state) while fn or the handler runs (an entered Call, until Done). A call that finds none free waits
	// for one in the semaphore's FIFO queue, for Timeout at most, and is then
	// refused with ErrBusy (Middleware: 503 with Retry-After), and the units
	// its admission took are given back. The permit's lease, InFlightLease,
	// is renewed while the call runs (mutex.AutoRenew); fn's context (the
	// handler's request context) is cancelled if the permit is lost, and a
	// process that dies mid-call frees its permit when the lease ends (see
	// InFlightLease for the bound, waiting calls included).
	// Allow and AllowN only decide: they take no permit. Zero is no bound;
	// a negative InFlight is ErrInvalidPolicy, and so is InFlight on a
	// Locker that cannot keep semaphores (a quorum WithRejoinDelay, given
	// with funnel.WithLocker). With funnel.WithReplicaAck the permits wait
	// for the replicas as the admissions do. Guards that
	// share a key's semaphore (one Prefix, or one funnel.WithLocker Locker)
	// must have the same InFlight: under another, a call is refused with
	// ErrRejected.
	//
	// When Redis cannot answer, OnError decides here too: FailClosed refuses
	// the call (ErrUnavailable); FailOpen and a Fallback bound the calls of a
	// key running in this process to InFlight. A permit costs two round
	// trips per call, taken after the admission and given back after fn.
	InFlight int64
	// InFlightLease is the lease of an InFlight permit
	// (DefaultInFlightLease if zero; under MinInFlightLease, negative, or
	// over mutex.MaxTTL, ErrInvalidPolicy). It is renewed every third of it while the call
	// runs, however long that is: it bounds not the call but how long a
	// dead process's permits stay taken. Each renewal is one round trip
	// with a third of the lease to land; if none lands before the lease
	// ends (Redis answered nothing for about a third of it or more), the
	// permit is lost and fn's context cancelled.
	//
	// A process killed mid-call frees its calls' permits within
	// InFlightLease. Its calls still waiting for a permit keep their places
	// by polling every 1 to 2 of the Locker's retry intervals and are passed
	// over 3 retry intervals after their last poll at most (their wait
	// lease); a permit granted to one before that is held, unrenewed, for
	// InFlightLease. So a killed process's permits are all back within 3
	// retry intervals + InFlightLease of its death: 3.15 s with the
	// defaults (mutex.DefaultRetryInterval, the guard's own Locker's, and
	// DefaultInFlightLease). A Locker given with funnel.WithLocker brings its
	// own retry interval; its TTL plays no part.
	InFlightLease time.Duration
	// Normalize, if set, maps a key to its canonical form (for example a
	// phone number to E.164) before anything else; an error rejects the key
	// with ErrInvalidKey.
	Normalize func(key string) (string, error)
	// Secret, if set, makes the guard store HMAC-SHA256(Secret, key) instead
	// of the key, so phone numbers and addresses never sit in Redis in clear
	// text. Keys longer than 128 bytes are always stored hashed.
	Secret []byte
	// Fallback, if set, decides locally while Redis cannot answer, instead of
	// OnError: a token bucket per key in this process.
	Fallback *Fallback
	// Observe, if set, is called after every decision (see Observation),
	// once its InFlight permit is known (Do, Enter, Middleware). It must be
	// fast and safe for concurrent use.
	Observe func(Observation)
	// Trace, if set, is called at the start of every decision (Allow,
	// AllowN, Do, Enter, Middleware, and so grpcguard's interceptors),
	// before its first command to Redis, with the call's ctx and key (the
	// caller's, before Normalize: the key in clear, for a hash of the
	// hook's making, never for a span or a log as it is). The context it
	// returns is the one the decision's Redis commands run in (with
	// go-redis's redisotel hooks, the parent of their spans), and so
	// are PlanOf and the wait for an InFlight permit; end, if not nil, is
	// called exactly once with the decision's Observation (as Observe
	// receives it), once the permit is known. otelguard.Tracer.Trace
	// starts a span here. Return a context derived from ctx (its deadline
	// is what bounds the decision on a hung server). A nil ctx is
	// ErrNilContext before Trace is called; a nil context returned is ctx.
	//
	// The context returned is the decision's only: fn of Do, the handler
	// of Middleware and Enter's Call.Context() run in the caller's ctx,
	// not under the ended span, and so do the release of the permit and
	// Do's refund of a failed fn. Peek and Refund are not decisions: no
	// Trace. Like Observe, it must be fast and safe for concurrent use.
	Trace func(ctx context.Context, key string) (_ context.Context, end func(Observation))
	// Plans, if set, are rule sets by name for keys whose limits depend on
	// whose they are (a tenant's plan: "free", 10 a minute; "pro", 1,000):
	// PlanOf names the plan of each call's key, at the call, and that
	// plan's rules decide it instead of Rules, which decide the keys whose
	// plan is "". A plan changed (a tenant upgraded) takes effect on the
	// key's next call; Middleware's RateLimit-Policy lists the plan's rules.
	//
	// The rules of every plan (and of Rules) of one kind (a funnel or
	// AtMost, a Window, a PerDay, a PerMonth) and one period (and zone)
	// keep one state in a key, in whatever order the plans list them (the
	// first of that kind and period in each plan shares with the first,
	// the second with the second; funnel.Rule.Sharing): a key moved to a
	// smaller plan is decided by it at once on what it took under the
	// larger (500 calls of the last minute deny it under "free" until they
	// are a minute old), and one moved up has the larger plan's room less
	// what it took. A rule no other plan has a match for starts from what
	// the key took under it, if ever. Names do not part the state: name a
	// plan's rules after it (Name "free") and RateLimit-Policy names the
	// plan. A rule of a plan keeps no gate in Redis (another plan's capacity could not read it): after a key's
	// first call, each of its calls, admitted or denied, takes two round
	// trips (without plans, a denial and a returning key's admission under
	// AtMost take one).
	Plans map[string][]funnel.Rule
	// PlanOf names the plan of key, the key as the caller gave it (before
	// Normalize), on every call (Allow, Peek, Refund, Do, Enter,
	// Middleware): "" is Rules. It must be fast (keep the tenants' plans
	// in memory) and safe for concurrent use. An error of it, or a name
	// Plans does not hold, refuses the call with ErrPlan (Middleware: 503
	// with Retry-After ErrorRetryAfter). Plans and PlanOf go together.
	PlanOf func(ctx context.Context, key string) (string, error)
	// Funnel configures the guard's funnel.Limiter: New passes
	// funnel.WithPrefix(Prefix) and then these options to funnel.New, and a
	// bad one is New's error (ErrInvalidPolicy and funnel.ErrInvalidOption).
	// The ones a guard is made with:
	//   - funnel.WithDenyCache(n): a key denied by Redis is denied in this
	//     process, without a command, until the gate time of that denial,
	//     with the Decision Redis gave (not Degraded), even while Redis
	//     cannot answer. A Refund through this Guard clears the key's entry
	//     at once; one by another process takes effect here at that gate
	//     time at the latest.
	//   - funnel.WithUniformCost(): a key never seen costs the same round
	//     trips as one seen before; set it when the keys are secrets whose
	//     use must not show in the answers' timing, such as phone numbers.
	//   - funnel.WithPenalty(p): a key its rules keep denying is boxed
	//     (Decision.Rule is funnel.PenaltyRule): the answer to brute force,
	//     guessing codes, hammering sends.
	//   - funnel.WithReplicaAck(n, d): an admission returns only once n
	//     replicas acknowledged its write within d, which must be under
	//     Timeout; one they did not acknowledge is an error matching
	//     mutex.ErrNotReplicated, which OnError or Fallback then decides.
	//   - funnel.WithLocker(l): the keys' locks are taken with l (on the same
	//     Redis), whose names are the guard's stored keys, and so are the
	//     InFlight semaphores: guards that share l share each key's.
	// A funnel.WithPrefix among them overrides Prefix for the keys in Redis.
	Funnel []funnel.Option
	// RateLimitHeaders makes Middleware send the IETF RateLimit-Policy and
	// RateLimit fields (draft-ietf-httpapi-ratelimit-headers-11). Off by
	// default: they disclose the quota.
	//
	// RateLimit-Policy lists every rule by its name with its own quota,
	// funnel.Rule.Quota: q units in any window of w seconds (rounded up).
	// For the rules AtMost(1, time.Minute), Window(5, time.Hour) and
	// Window(10, 24*time.Hour), a cooldown, 5 an hour and 10 a day:
	//
	//	RateLimit-Policy: "1/1m0s";q=1;w=60, "5 in 1h0m0s";q=5;w=3600, "10 in 24h0m0s";q=10;w=86400
	//
	// RateLimit gives one rule's state: after an admission, the rule with
	// the least room (Decision.Tightest: r its units left, t the seconds
	// until it alone is empty, Decision.TightestReset); after a denial, the
	// rule that denied (Decision.Rule, or the Tightest for the penalty box,
	// which is no rule), r=0 and t the Retry-After. pk names the key's
	// partition without telling the key:
	//
	//	RateLimit: "1/1m0s";r=0;t=60;pk=:...:
	//
	// A funnel's q counts its burst and what leaks back within w: a funnel
	// of Capacity 10 leaking 10 a second is q=19;w=1.
	RateLimitHeaders bool
	// Shadow decides, counts and observes every call as usual but blocks
	// none: Middleware lets denied requests through (with the RateLimit
	// fields, if on, and the real Decision in FromContext), Enter admits
	// denied calls (with the real Decision in Call.Decision), and each
	// Observation has Shadow set. Allow and AllowN still return the real
	// Decision. Use it to roll a new limit out dark and watch what it
	// would deny first.
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
	if p.Prefix == "" {
		p.Prefix = DefaultPrefix
	}
	if why := p.invalid(); why != "" {
		return p, fmt.Errorf("%w: %s", ErrInvalidPolicy, why)
	}
	p, err := p.durations()
	if err != nil {
		return p, err
	}
	if f := p.Fallback; f != nil {
		fc := *f
		if fc.MaxKeys == 0 {
			fc.MaxKeys = DefaultFallbackMax
		}
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

// invalid returns why p's prefix, rules, OnError or Fallback cannot be
// used, "" if they can (durations and plans are checked apart).
func (p Policy) invalid() string {
	if err := keyspace.CheckPrefix(p.Prefix); err != nil {
		return fmt.Sprintf("prefix %q: %v", p.Prefix, err)
	}
	switch f := p.Fallback; {
	case len(p.Rules) == 0 && len(p.Plans) > 0:
		return "no Rules: with Plans too, Rules decide the keys whose plan is \"\""
	case len(p.Rules) == 0:
		return "no rules"
	case p.OnError != FailClosed && p.OnError != FailOpen:
		return fmt.Sprintf("OnError %d", p.OnError)
	case f != nil && (f.Limit <= 0 || f.Burst <= 0 || f.MaxKeys < 0):
		return "Fallback needs a positive Limit and Burst"
	}
	return ""
}
