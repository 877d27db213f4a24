// Package guard gives an endpoint one call, Allow(ctx, key), that combines
// the funnel limiter and the Redis mutex under a Policy: several rules per
// key decided all or nothing, refunds, a failure mode for when Redis is down,
// hashed keys, and net/http middleware.
//
//	g, err := guard.New(client, guard.Policy{
//		Prefix: "sms:phone:",
//		Rules: []funnel.Rule{
//			funnel.AtMost(1, time.Minute),   // cooldown: 60 s between codes
//			funnel.Window(5, time.Hour),     // 5 in any hour
//			funnel.Window(10, 24*time.Hour), // 10 in any 24 h
//		},
//		Secret: hmacKey, // phone numbers never sit in Redis in clear text
//	})
//	d, err := g.Do(ctx, phone, send) // send runs only if admitted; refunded if it fails
//
// Build the client with ContextTimeoutEnabled, so that Policy.Timeout bounds
// each Redis command in go-redis itself (a client without it works: its
// calls are then left behind at the deadline, see package mutex):
//
//	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
//
// When Redis cannot answer within Policy.Timeout, a Guard fails closed by
// default (an SMS costs money): it denies with RetryAfter and an error
// matching ErrUnavailable. A Redis that refuses connections is decided so
// at once (the error matches funnel.ErrUnreachable too), whatever the
// client's options: go-redis spends up to 1.7 s on a refused command with
// its defaults, so a Guard on a *redis.Client dials, with the client's own
// dialer, once a call has run for 50 ms; a refused dial ends that call and
// the next ones until a dial connects (one of them dials every 20 ms). A
// dial that connects or times out is no refusal: a hung server costs the
// Timeout. DialerRetries: 1 and MinRetryBackoff: -1 make go-redis itself
// answer a refusal at once. For 1.1 s after a dial connects again, a call
// that the client refuses without sending it is made again on a client of
// the Guard's own, made from the client's options (without its hooks, which
// see the refused attempt but not the detoured command): go-redis's dial
// breaker, which an outage's first failed dials can open, refuses the
// client's new connections for up to a second after the server is back. A Policy whose Funnel options bring their own Locker
// (funnel.WithLocker), and InFlight's permits, take no such detour. FailOpen decides with the Policy's rules in this
// process (funnel.Local) instead, so it is never unlimited: each process
// admits at most the rules' bound per key. A Fallback decides with an
// in-process token bucket per key. An answer that will not change (NOPERM,
// OOM, scripting disabled, a corrupt key) denies whatever the Policy says,
// with ErrRejected: failing open on it would let whoever can break a key or
// a permission open the limit.
//
// With Policy.RateLimitHeaders, Middleware tells clients each rule's quota
// as the rule means it (RateLimit-Policy: Window(5, time.Hour) is
// q=5;w=3600) and the state of the rule with the least room, or of the one
// that denied (RateLimit: its own r and t, not the whole key's).
//
// With Policy.InFlight, Do, Middleware and Enter also bound the calls of a key that
// run at once, across the fleet: each holds a permit of the key's
// mutex.Semaphore while it runs, and one that gets none within Timeout is
// refused with ErrBusy (503 with Retry-After), its units given back. A
// permit's lease, Policy.InFlightLease (3 s by default), is renewed while
// the call runs: a process killed mid-call or while its calls wait has its
// permits back within 3.15 s.
//
// Enter decides a call as Middleware decides a request (Shadow, InFlight,
// FailOpen's and the Fallback's denials alike), for servers of other
// transports: it returns a Call to run if Admitted and to end with Done.
//
// With Policy.Plans and Policy.PlanOf, each key is decided by the rules of
// its plan at the call (a tenant's "free" or "pro"), one Guard for every
// plan; a changed plan takes effect on the next call, with what the key
// took kept (see Policy.Plans).
//
// The package does not log and imports no metrics library: Policy.Observe
// receives every decision, its error and latency, for Prometheus or
// OpenTelemetry; Policy.Trace is called as each decision starts, whatever
// its entry point, and gives the context its Redis commands run in (a span
// of otelguard's, their parent) and ends with its Observation.
package guard
