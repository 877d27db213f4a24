package funnel

import (
	"math"
	"time"
)

// A level is the state of one rule: how full its funnel was (in
// unit-microseconds) at server time at (µs).
type level struct {
	fill int64
	at   int64
}

// satAdd returns a+b for a, b >= 0, or MaxInt64 where that overflows.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// ceilDiv returns ⌈a/b⌉ for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 {
	return a/b + min(a%b, 1)
}

// drain returns the fill of r's funnel at now. A clock that moved back
// (now < at) drains nothing; a long idle time empties it without overflow.
func (r rule) drain(s level, now int64) int64 {
	if now <= s.at || s.fill <= 0 {
		return max(s.fill, 0)
	}
	d := now - s.at
	if d >= ceilDiv(s.fill, r.leak) {
		return 0
	}
	return s.fill - d*r.leak // d*leak < fill <= 2^61
}

// wait returns how long, in µs, until n units fit in a funnel holding fill.
func (r rule) wait(fill, n int64) int64 {
	excess := fill + n*r.per - r.full
	if excess <= 0 {
		return 0
	}
	return ceilDiv(excess, r.leak)
}

// A decision is the outcome of one call over all its rules.
type decision struct {
	allowed bool
	denied  int     // index of the denying rule (longest wait), -1 if allowed
	fills   []int64 // after the call
	ats     []int64 // the server time of each fill
	retry   int64   // µs until the call would be admitted; 0 if allowed
}

// clock returns the time a rule's state is taken to at now: its clock never
// goes back, so a server clock behind the stored time (a failover to a
// server whose clock lags) credits no leak twice.
func clock(s level, now int64) int64 { return max(now, s.at) }

// decide admits n units at now if they fit in every rule, all or nothing.
func decide(rules []rule, states []level, now, n int64) decision {
	d := decision{allowed: true, denied: -1, fills: make([]int64, len(rules)), ats: make([]int64, len(rules))}
	for i, r := range rules {
		d.ats[i] = clock(states[i], now)
		d.fills[i] = r.drain(states[i], d.ats[i])
		if w := r.wait(d.fills[i], n); w > 0 {
			if w = satAdd(w, d.ats[i]-now); w > d.retry {
				d.allowed, d.denied, d.retry = false, i, w
			}
		}
	}
	if d.allowed {
		for i, r := range rules {
			d.fills[i] += n * r.per
		}
	}
	return d
}

// refund takes n units out of every rule at now, never below empty, and
// returns the fills and their times.
func refund(rules []rule, states []level, now, n int64) (fills, ats []int64) {
	fills, ats = make([]int64, len(rules)), make([]int64, len(rules))
	for i, r := range rules {
		ats[i] = clock(states[i], now)
		fills[i] = max(r.drain(states[i], ats[i])-min(n, r.full/r.per)*r.per, 0)
	}
	return fills, ats
}

// Result is the outcome of a call for one key.
type Result struct {
	// Allowed reports whether the call was admitted (Peek: would be).
	Allowed bool
	// Rule names the rule that denied the call: the one that admits it last.
	// Empty when allowed.
	Rule string
	// Remaining is how many units the tightest rule would still admit right
	// after this call.
	Remaining int64
	// Tightest names that rule: the one with the fewest units left.
	Tightest string
	// RetryAfter is how long until the same call would be admitted by every
	// rule; 0 when allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until every rule's funnel is empty.
	ResetAfter time.Duration
}

// result describes d for the caller.
func (d decision) result(rules []rule) Result {
	res := Result{Allowed: d.allowed, RetryAfter: micros(d.retry)}
	if d.denied >= 0 {
		res.Rule = rules[d.denied].name
	}
	var reset int64
	for i, r := range rules {
		left := (r.full - d.fills[i]) / r.per
		if i == 0 || left < res.Remaining {
			res.Remaining, res.Tightest = left, r.name
		}
		reset = max(reset, ceilDiv(d.fills[i], r.leak))
	}
	res.ResetAfter = micros(reset)
	return res
}

// micros converts µs to a Duration, clamped instead of overflowing.
func micros(us int64) time.Duration {
	const most = int64(1<<63-1) / int64(time.Microsecond)
	if us > most {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(us) * time.Microsecond
}
