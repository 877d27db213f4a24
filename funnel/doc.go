// Package funnel is a leaky-bucket ("funnel") rate limiter whose state lives
// in Redis and whose read-modify-write runs under a mutex.Locker.
//
//	lim := funnel.New(client)
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
// in the script that releases it. A call that is deniable when it arrives
// costs one round trip and never waits for the lock, even while another
// caller holds it: the read script itself sees that no unit fits. A call that
// waits for the lock re-reads the state with every attempt and is denied as
// soon as it says so. A commit
// whose lock lease lapsed (a paused process) is rejected and the call starts
// over on fresh state.
//
// Every state key expires when all its funnels would be empty.
package funnel
