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
// # Choosing a rule
//
// A Rule of Capacity C leaking R units per P admits a burst of C, then one
// unit per P/R: the decisions of GCRA and of
// redis_rate.Limit{Burst: C, Rate: R, Period: P}. "10 a day" means three
// things; pick the rule that says yours:
//
//   - A funnel (Rule, AtMost) for smooth rates and bursts: AtMost(10, 24h)
//     admits 10 at once, then one a day for as long as calls keep coming;
//     a cooldown AtMost(1, time.Minute) is one call a minute.
//   - Window(10, 24h), a sliding log, for "n per period" as people say it:
//     never more than 10 in any 24 hours, each unit back 24 hours after it
//     was taken.
//   - PerDay(10, loc) and PerMonth for budgets: 10 per calendar day in
//     loc, all of them again at local midnight, whatever the day's length.
//
// Example_tenADay prints a week of each. The rules of one call are decided
// all or nothing, under one lock, and kept in one hash, <prefix>{<key>}:f,
// which expires when every rule would be empty. Refund gives units back;
// Peek reads without changing anything.
//
// # Exactness
//
// Time is the Redis server's TIME, read in the script that decides, so
// application servers' clocks never matter. Levels are integers in
// unit-microseconds: no floating point, no leak lost to rounding, no
// overflow (rules whose Capacity*Per would pass 2^61 µs are refused), and a
// clock that steps back drains nothing.
//
// # Cost
//
// A deniable call costs one round trip and never waits for the lock. An
// admission costs one or two; concurrent admissions of one key in one
// Limiter share a lock hold. DESIGN.md in this directory says when, and how.
//
// # A failed call is not charged
//
// A call with a ctx deadline that is answered with an error took nothing,
// even if its write runs later, and returns by its deadline even while it
// holds its key's lock. DESIGN.md lists the cases this does not cover.
package funnel
