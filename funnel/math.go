package funnel

import (
	"math"
	"slices"
	"time"
)

// A level is the state of one rule: its funnel's fill (unit-µs) at server
// time at (µs). A window's log holds its units' times, ascending, and fill
// their number; a pointer, so that a funnel's level stays 24 bytes.
type level struct {
	fill int64
	at   int64
	log  *[]int64
}

func (s level) units() []int64 {
	if s.log == nil {
		return nil
	}
	return *s.log
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

// expiryOf returns the expiry (Unix ms) a key needs for a value of funnel
// r that is empty from server time empty (µs): that time in ms, rounded up
// to r.grid. Every write of a funnel's value gives the key at least this, so a
// value read tells a bound on the key's expiry (returning.lua).
func (r rule) expiryOf(empty int64) int64 {
	ms := ceilDiv(empty, 1000)
	return satAdd(ms, (r.grid-ms%r.grid)%r.grid)
}

// drain returns the fill of r's funnel at now; a clock that moved back
// drains nothing.
func (r rule) drain(s level, now int64) int64 {
	d := max(now-s.at, 0)
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

// live returns the units of log still in window r at now: those taken
// after now - window.
func (r rule) live(log []int64, now int64) []int64 {
	i, _ := slices.BinarySearch(log, now-r.window+1)
	return log[i:]
}

// windowWait returns how long, in µs from now, until n more units fit in
// window r holding live.
func (r rule) windowWait(live []int64, now, n int64) int64 {
	excess := int64(len(live)) + n - r.full
	if excess <= 0 {
		return 0
	}
	return live[excess-1] + r.window - now
}

// calendarWait returns how long, in µs from t, until n more units fit in
// calendar rule r holding count at t: 0, or until t's period ends.
func (r rule) calendarWait(count, t, n int64) int64 {
	if count+n <= r.full {
		return 0
	}
	_, end := r.cal.period(t)
	return end - t
}

// withUnits returns a new log: live, then n units taken at.
func withUnits(live []int64, at, n int64) []int64 {
	log := make([]int64, len(live), len(live)+int(n))
	copy(log, live)
	for range n {
		log = append(log, at)
	}
	return log
}

// A decision is the outcome of one call over all its rules.
type decision struct {
	allowed bool
	denied  int       // index of the denying rule (longest wait), -1 if allowed
	fills   []int64   // after the call
	ats     []int64   // the server time of each fill
	logs    [][]int64 // each window's units after the call; nil without windows
	retry   int64     // µs until the call would be admitted; 0 if allowed
}

func (d decision) level(i int) level {
	lv := level{fill: d.fills[i], at: d.ats[i]}
	if d.logs != nil {
		lv.log = &d.logs[i]
	}
	return lv
}

// clock returns the time a rule's state is taken to at now: never back, so
// a server clock behind the stored time credits no leak twice.
func clock(s level, now int64) int64 { return max(now, s.at) }

// decide admits n units at now if they fit in every rule, all or nothing;
// states nil is every rule empty.
func decide(rules []rule, states []level, now, n int64) decision {
	k := len(rules)
	buf := make([]int64, 2*k) // fills and ats in one allocation
	d := decision{allowed: true, denied: -1, fills: buf[:k:k], ats: buf[k:]}
	for i, r := range rules {
		var s level
		if states != nil {
			s = states[i]
		}
		d.ats[i] = clock(s, now)
		switch {
		case r.window > 0:
			if d.logs == nil {
				d.logs = make([][]int64, len(rules))
			}
			d.logs[i] = r.live(s.units(), d.ats[i])
			d.fills[i] = int64(len(d.logs[i]))
		case r.cal != nil:
			d.fills[i] = r.cal.count(s, d.ats[i])
		default:
			d.fills[i] = r.drain(s, d.ats[i])
		}
		if w := r.waitIn(d.level(i), n); w > 0 {
			if w = satAdd(w, d.ats[i]-now); w > d.retry {
				d.allowed, d.denied, d.retry = false, i, w
			}
		}
	}
	if d.allowed {
		for i, r := range rules {
			d.fills[i] += n * r.per
			if r.window > 0 {
				d.logs[i] = withUnits(d.logs[i], d.ats[i], n)
			}
		}
	}
	return d
}

// unpeek undoes what d, an admission of one unit, took.
func (d *decision) unpeek(rules []rule) {
	for i, r := range rules {
		d.fills[i] -= r.per
		if r.window > 0 {
			d.logs[i] = d.logs[i][:len(d.logs[i])-1]
		}
	}
}

// refund takes n units out of every rule at now, never below empty (a
// window its newest, a calendar rule the current period's), and returns
// the levels after.
func refund(rules []rule, states []level, now, n int64) []level {
	out := make([]level, len(rules))
	for i, r := range rules {
		at := clock(states[i], now)
		switch {
		case r.window > 0:
			live := r.live(states[i].units(), at)
			log := live[:len(live)-int(min(n, int64(len(live))))]
			out[i] = level{fill: int64(len(log)), at: at, log: &log}
		case r.cal != nil: // units of the current period only
			out[i] = level{fill: max(r.cal.count(states[i], at)-n, 0), at: at}
		default:
			out[i] = level{fill: max(r.drain(states[i], at)-min(n, r.full/r.per)*r.per, 0), at: at}
		}
	}
	return out
}

// Result is the outcome of a call for one key.
type Result struct {
	// Allowed reports whether the call was admitted (Peek: would be).
	Allowed bool
	// Rule names the rule that denied the call: of several, the one that
	// admits it last, then the first. Empty when allowed.
	Rule string
	// Remaining is how many units the Tightest rule would still admit
	// right after this call.
	Remaining int64
	// Tightest names the rule with the fewest units left: of several, the
	// one empty last, then the first.
	Tightest string
	// RetryAfter is how long until the same call would be admitted by every
	// rule; 0 when allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until every rule is empty.
	ResetAfter time.Duration
	// TightestReset is how long until the Tightest rule is empty.
	TightestReset time.Duration
}

func (d decision) result(rules []rule) Result {
	res := Result{Allowed: d.allowed, RetryAfter: micros(d.retry), Remaining: math.MaxInt64} // the first rule's left is less
	if d.denied >= 0 {
		res.Rule = rules[d.denied].name
	}
	var reset, tight int64
	for i, r := range rules {
		left := max(r.full-d.fills[i], 0) / r.per
		empty := r.waitIn(d.level(i), r.full/r.per)
		if left < res.Remaining || left == res.Remaining && empty > tight {
			res.Remaining, res.Tightest, tight = left, r.name, empty
		}
		reset = max(reset, empty)
	}
	res.ResetAfter, res.TightestReset = micros(reset), micros(tight)
	return res
}

// waitIn returns how long, in µs from lv.at, until n more units fit in
// rule r holding lv; for n of its capacity, until it is empty.
func (r rule) waitIn(lv level, n int64) int64 {
	switch {
	case r.window > 0:
		return r.windowWait(lv.units(), lv.at, n)
	case r.cal != nil:
		return r.calendarWait(lv.fill, lv.at, n)
	}
	return r.wait(lv.fill, n)
}

// micros converts µs to a Duration, clamped instead of overflowing.
func micros(us int64) time.Duration {
	const most = int64(1<<63-1) / int64(time.Microsecond)
	if us > most {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(us) * time.Microsecond
}
