// Package funnel is a leaky-bucket ("funnel") rate limiter whose state lives
// in Redis and whose read-modify-write runs under a mutex.Locker.
//
//	lim, err := funnel.New(client) // ErrInvalidOption for a nil client or a bad option
//	if err != nil {
//		return err
//	}
//	hour := funnel.Rule{Name: "hour", Capacity: 3, Leak: 2, Per: time.Hour}
//	res, err := lim.Allow(ctx, "sms:+8613800138000", hour, funnel.AtMost(10, 24*time.Hour))
//	if err == nil && !res.Allowed {
//		// res.Rule denied; try again in res.RetryAfter
//	}
//
// # Semantics
//
// A Rule of Capacity C leaking R units per P admits a burst of C, then one
// unit per P/R. It makes the same decisions as GCRA and as
// redis_rate.Limit{Burst: C, Rate: R, Period: P}. Within a window of length
// W it admits up to about C + W*R/P units; AtMost(n, w) is the rule that
// never admits more than n in any window of length w.
//
// Window(n, w) is a sliding log instead of a funnel: at most n units in any
// window of length w, each unit available again exactly w after it was
// taken, so a full window admits n again as soon as its first n units have
// left (AtMost spreads them out). It keeps the time of each of its units (n
// is at most MaxWindow), in the same hash as the key's funnels, and is
// decided with them, all or nothing; a Refund gives back its newest units.
//
// PerDay(n, loc) and PerMonth(n, loc) are calendar budgets: at most n units
// from local midnight to the next in the zone loc (from the 1st to the 1st),
// on the server's clock, whatever the day's length (23 or 25 hours across a
// clock change); a denied call can retry at the next local midnight,
// exactly. A date whose midnight a clock change skips (America/Havana's
// clocks jump from 00:00 to 01:00) starts when the clock jumps. Their state
// is a count and the time of its last change.
//
// # Choosing a rule
//
// "10 a day" means three things; pick the rule that says yours:
//
//   - A funnel (Rule, AtMost) for smooth rates and bursts: AtMost(10, 24h)
//     admits 10 at once, then one a day for as long as calls keep coming;
//     a cooldown AtMost(1, time.Minute) is one call a minute.
//   - Window(10, 24h) for "n per period" as people say it: never more than
//     10 in any 24 hours, and 10 again once the first 10 are a day old.
//   - PerDay(10, loc) for budgets: 10 per calendar day, all of them again
//     at local midnight (so up to 20 within a few minutes around it).
//
// A user who tries 20 times a day, every 72 minutes, gets 10 on the first
// day under each; then 1 a day under AtMost, 10 a day under the other two
// (Example_tenADay prints the week).
//
// The rules of one call are decided all or nothing, under one lock, and kept
// in one hash: a call denied by a daily rule takes nothing from a cooldown
// rule. Refund gives units back; Peek reads without changing anything.
//
// # Exactness
//
// Time is the Redis server's TIME, read in the same script as the state, so
// application servers' clocks never matter. Levels are integers in
// unit-microseconds draining by Leak per microsecond: no floating point, no
// leak lost to rounding, no overflow (rules whose Capacity*Per would pass
// 2^61 µs are refused), and a clock that steps back drains nothing.
//
// # Cost
//
// An admission costs two round trips when the key is not locked: the state is
// read with the lock attempt, and written, only while the lock is still held,
// in the script that releases it. A key none of whose rules has state (its
// first call, or one after every funnel emptied and expired) is admitted in
// one: when its lock is free, the script that reads the state writes the new
// one itself, exactly what the two round trips would write, with a nonce
// that makes a retried script answer as its first run. (WithUniformCost
// turns this off, where a key's first call must not be told apart by its
// timing; nor does it apply to a call with a calendar rule, whose first
// admission takes two.) A call that is deniable when it arrives
// costs one round trip and never waits for the lock, even while another
// caller holds it: the read script itself sees that no unit fits. A call that
// waits for the lock re-reads the state with every attempt and is denied as
// soon as it says so. A commit
// whose lock lease lapsed (a paused process) is rejected and the call starts
// over on fresh state.
//
// A returning key (a phone number, an IP, a tenant) costs one round trip
// too, when every rule of the call is a funnel (AtMost, a Rule; not
// Window, PerDay, PerMonth, nor a rule made with Sharing, whose returning
// admissions take two, and a Sharing rule's denials too, as it keeps no
// gate): the Limiter remembers the state it last read or wrote per key
// (WithStateCache), decides the call on it in advance, and sends times and
// values; Redis admits the call if the lock is free and the state is the
// one remembered, comparing its TIME with those times (no arithmetic in
// Lua). A key whose admissions in this process have others waiting (a hot
// key, a global budget shared by a fleet) is crowded: each batch reads the
// state and commits its decisions without the lock, if the state is still
// what it read and the lock is free; otherwise it is decided again on the
// state the commit found, at once. That is what the lock guarantees (no
// write between a batch's read and its write), without a lock hold to hand
// between processes. Every such write carries a nonce, so a retried script
// answers as its first run.
//
// # A failed call is not charged
//
// A call with a ctx deadline that is answered with an error took nothing,
// even if its write, stuck in a stopped server or a slow network, runs
// later: every write of an admission carries a server time past which
// Redis refuses it, which the server's clock reaches before the caller's
// deadline. It is taken from the Limiter's sample of the server's clock
// (the TIME of a recent reply, and the local monotonic time it came) less 1
// ms and 1/1000 of the time to the deadline, for drift. A write refused
// while its call still has time is decided again on a fresh read; a late
// one-round-trip admission also takes no lock. This does not hold for: a
// call with no deadline whose write was sent before an error (a lost
// connection; the write may run); a call cancelled before its deadline
// whose write the server still runs in time (the call returns at the
// cancellation, its write on its way: a stopped server runs it when it
// continues); a write that ran in time whose reply was
// lost or came more than the margin late (the server stopped between them);
// a server clock that steps back between the sample and the write; a
// commit not acknowledged by replicas (WithReplicaAck); Refund and Reset;
// and a penalty box's count of a denial. It costs the commit one TIME in
// Redis, and a first call of a Limiter, or of a Limiter idle for a minute,
// goes through the lock (two round trips) to take a sample.
//
// A call whose time runs out while it holds its key's lock (the lock's
// reply came late: a server stopped just after it ran the attempt, a
// starved process) writes nothing and returns by its deadline; the lock is
// released by a goroutine of its own, bounded by 2 s, as soon as Redis
// answers again, so the key's next calls do not wait for the lease.
//
// Every state key expires when all its funnels would be empty (its windows
// hold no unit, its calendar rules' periods have ended). An active
// key with one rule takes 136 bytes of Redis memory: the hash
// <prefix>{<key>}:f, one field per rule (48 bits of the rule's definition,
// base64url) holding "<gate>:<fill>:<at>" in base 36.
//
// # Hot keys
//
// Concurrent admissions of one key with the same rules in one Limiter share
// a lock hold (WithoutBatching turns this off): while one call takes the
// lock and reads the state, the calls that arrive join it; when the state
// comes back they are decided in arrival order on it, each all or nothing
// and each seeing the units taken before it, and one script writes the
// result and releases the lock. A key that every admission of a fleet goes
// through (a global budget, a destination prefix, a tenant) so costs two
// round trips per batch, not per call, with the decisions of the calls run
// one after another at the server time of the read. A call whose context
// ends while it waits in a batch returns at once, and its batch takes
// nothing for it unless it was decided first; when the leader's context
// ends, the others run again under their own (a call sent round so 8 times
// then leads alone), and when its lock attempt fails otherwise (a refusal,
// a lost connection, an error reply), they end with its error. A batch
// whose lease lapsed before its write is decided again, every call of it,
// on fresh state.
//
// # Deny cache
//
// WithDenyCache(maxKeys) (off by default) answers a flooded key in this
// process. When Redis denies a call, it says when the same call would be
// admitted: the gate time T, on the server's clock, as the wait RetryAfter.
// The Limiter keeps that wait as a deadline on its own monotonic clock,
// counted from before the call was sent (so before Redis read its clock),
// and until then denies the key's calls with the same rules (the same
// Rules in the same order) and at least as many units without asking
// Redis. A hit returns the denial's Result as Redis gave it, with
// RetryAfter, ResetAfter and TightestReset counting down: Allowed false,
// and Rule, Remaining and Tightest as of the denial. (For a call of one unit, Redis
// would give the same Rule and Remaining 0 until T; with several full
// rules, Tightest may name one that has since drained; a call of more
// units than the cached one is denied at least until T, but Redis would
// give it a longer RetryAfter.)
//
// The cache never denies past T, given clocks that run at the same rate:
// the deadline falls before T by the time the denied call took to reach
// Redis's clock (part of a round trip; longer if it waited for the lock),
// so a call may go to Redis a little early and be denied there once more.
// Only durations cross from the server: the clocks of Redis and of this
// process need not agree.
//
// A Refund or Reset through the same Limiter clears the key's entry as it
// commits, and a denial read before it is not cached after it. A refund or
// reset in another process (or through another Limiter in this one), or any
// other change of the key in Redis, takes effect there at once and here at
// T at the latest: until T this Limiter keeps denying the key, though Redis
// would admit it; the first call at or after T asks Redis and sees the new
// state. Peek always reads Redis.
//
// The cache holds the latest denial of the maxKeys keys most recently
// denied by Redis (the oldest are evicted first) and runs no goroutine: an
// expired entry is a miss, and its room is reused. A hit takes a read lock
// and a map lookup, allocates nothing, and answers even while Redis is
// down. Calls
// of more than four rules, or of rule sets past the Limiter's first 256
// distinct ones, are never answered from the cache.
package funnel
