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
// A call that is deniable when it arrives costs one round trip and never
// waits for the lock (not under a rule made with Sharing, which keeps no
// gate). An admission of a new key, or of a returning key
// whose every rule is a funnel (Rule, AtMost), costs one when its lock is
// free; any other admission costs two (the state read with the lock, then
// written, while the lock is held, in the script that releases it).
// Concurrent admissions of one key in one Limiter share a lock hold
// (WithoutBatching turns this off). DESIGN.md in this directory says how,
// and the exceptions (WithUniformCost, calendar rules, Window and Sharing
// rules on a returning key).
//
// # A failed call is not charged
//
// A call with a ctx deadline that is answered with an error took nothing,
// even if its write runs later: every write carries a server time past
// which Redis refuses it, reached before the caller's deadline. A call
// whose time runs out while it holds its key's lock writes nothing and
// returns by its deadline; the lock is released by a goroutine of its own,
// bounded by 2 s. DESIGN.md lists the cases this does not cover (a call
// with no deadline, a lost reply, a server clock that steps back, Refund,
// Reset).
//
// Every state key expires when all its funnels would be empty. An active
// key with one rule takes 136 bytes of Redis memory: the hash
// <prefix>{<key>}:f, one field per rule.
//
// # Deny cache
//
// WithDenyCache(maxKeys) (off by default) answers a flooded key in this
// process: after Redis denies a call, the key's calls with the same rules
// and at least as many units are denied here, with the denial's Result
// counting down, until the moment Redis said the call would be admitted
// (never later, on clocks that run at the same rate). A Refund or Reset
// through the same Limiter clears the key's entry; a change made elsewhere
// takes effect here at that moment at the latest. The cache holds the
// latest denials of the maxKeys keys most recently denied and runs no
// goroutine; DESIGN.md has its details.
package funnel
