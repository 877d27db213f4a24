package funnel

import (
	"math"
	"slices"
	"time"
)

// A level is the state of one rule: how full its funnel was (in
// unit-microseconds) at server time at (µs). A window's level is its units
// instead: log holds the times (µs, ascending) of the units taken before at,
// some of which may have left the window since, and fill their number. (A
// pointer, nil for a funnel: a funnel's level stays 24 bytes.)
type level struct {
	fill int64
	at   int64
	log  *[]int64
}

// units returns a window's log, nil if it has none.
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

// live returns the units of window r still in it at now, of log: those
// taken after now - window (a unit taken at t is available again at t +
// window exactly).
func (r rule) live(log []int64, now int64) []int64 {
	i, _ := slices.BinarySearch(log, now-r.window+1)
	return log[i:]
}

// windowWait returns how long, in µs from now, until n more units fit in
// window r, whose units still in it are live: until the oldest units that
// must leave have left. n is at most r's capacity (checkN).
func (r rule) windowWait(live []int64, now, n int64) int64 {
	excess := int64(len(live)) + n - r.full
	if excess <= 0 {
		return 0
	}
	return live[excess-1] + r.window - now
}

// windowEmpty returns how long, in µs from now, until window r holds no
// units, the last of log leaving it.
func (r rule) windowEmpty(log []int64, now int64) int64 {
	if len(log) == 0 {
		return 0
	}
	return max(log[len(log)-1]+r.window-now, 0)
}

// calendarWait returns how long, in µs from t, until n more units fit in
// calendar rule r holding count units at t: none while they fit, else until
// t's period ends. n is at most r's n (checkN).
func (r rule) calendarWait(count, t, n int64) int64 {
	if count+n <= r.full {
		return 0
	}
	_, end := r.cal.period(t)
	return end - t
}

// calendarEmpty returns how long, in µs from t, until calendar rule r
// holding count units at t counts none: until t's period ends, if count > 0.
func (r rule) calendarEmpty(count, t int64) int64 {
	if count == 0 {
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
	denied  int     // index of the denying rule (longest wait), -1 if allowed
	fills   []int64 // after the call
	ats     []int64 // the server time of each fill
	// logs holds each window rule's units after the call (nil when the
	// call has no window rule; a funnel's entry is nil).
	logs  [][]int64
	retry int64 // µs until the call would be admitted; 0 if allowed
}

// level returns rule i's level after d.
func (d decision) level(i int) level {
	lv := level{fill: d.fills[i], at: d.ats[i]}
	if d.logs != nil {
		lv.log = &d.logs[i]
	}
	return lv
}

// clock returns the time a rule's state is taken to at now: its clock never
// goes back, so a server clock behind the stored time (a failover to a
// server whose clock lags) credits no leak twice.
func clock(s level, now int64) int64 { return max(now, s.at) }

// decide admits n units at now if they fit in every rule, all or nothing;
// states nil is every rule empty.
func decide(rules []rule, states []level, now, n int64) decision {
	d := decision{allowed: true, denied: -1, fills: make([]int64, len(rules)), ats: make([]int64, len(rules))}
	for i, r := range rules {
		var s level
		if states != nil {
			s = states[i]
		}
		d.ats[i] = clock(s, now)
		var w int64
		switch {
		case r.window > 0:
			if d.logs == nil {
				d.logs = make([][]int64, len(rules))
			}
			d.logs[i] = r.live(s.units(), d.ats[i])
			d.fills[i] = int64(len(d.logs[i]))
			w = r.windowWait(d.logs[i], d.ats[i], n)
		case r.cal != nil:
			d.fills[i] = r.cal.count(s, d.ats[i])
			w = r.calendarWait(d.fills[i], d.ats[i], n)
		default:
			d.fills[i] = r.drain(s, d.ats[i])
			w = r.wait(d.fills[i], n)
		}
		if w > 0 {
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

// unpeek undoes what d, an admission of one unit, took: Peek reports the
// state as it is.
func (d *decision) unpeek(rules []rule) {
	for i, r := range rules {
		d.fills[i] -= r.per
		if r.window > 0 {
			d.logs[i] = d.logs[i][:len(d.logs[i])-1]
		}
	}
}

// refund takes n units out of every rule at now, never below empty, and
// returns the fills, their times and the windows' logs (nil if none): a
// window gives back its newest units, a calendar rule units of the current
// period.
func refund(rules []rule, states []level, now, n int64) (fills, ats []int64, logs [][]int64) {
	fills, ats = make([]int64, len(rules)), make([]int64, len(rules))
	for i, r := range rules {
		ats[i] = clock(states[i], now)
		if r.window > 0 {
			if logs == nil {
				logs = make([][]int64, len(rules))
			}
			live := r.live(states[i].units(), ats[i])
			logs[i] = live[:len(live)-int(min(n, int64(len(live))))]
			fills[i] = int64(len(logs[i]))
			continue
		}
		if r.cal != nil { // units of the current period only
			fills[i] = max(r.cal.count(states[i], ats[i])-n, 0)
			continue
		}
		fills[i] = max(r.drain(states[i], ats[i])-min(n, r.full/r.per)*r.per, 0)
	}
	return fills, ats, logs
}

// Result is the outcome of a call for one key.
type Result struct {
	// Allowed reports whether the call was admitted (Peek: would be).
	Allowed bool
	// Rule names the rule that denied the call; when several deny, the one
	// that admits it last (its wait is RetryAfter; the first of the call's
	// rules among equal waits). Empty when allowed.
	Rule string
	// Remaining is how many units the tightest rule would still admit right
	// after this call (a window: its n less the units in it).
	Remaining int64
	// Tightest names that rule: the one with the fewest units left; among
	// several, the one that is empty last (TightestReset), then the first
	// in the call's order. It is the rule that binds: its units come back
	// last.
	Tightest string
	// RetryAfter is how long until the same call would be admitted by every
	// rule; 0 when allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until every rule's funnel is empty (a
	// window's: until it holds no unit).
	ResetAfter time.Duration
	// TightestReset is how long until the Tightest rule alone is empty: a
	// funnel drained, a window's newest unit gone out of it. At most
	// ResetAfter.
	TightestReset time.Duration
}

// result describes d for the caller.
func (d decision) result(rules []rule) Result {
	res := Result{Allowed: d.allowed, RetryAfter: micros(d.retry)}
	if d.denied >= 0 {
		res.Rule = rules[d.denied].name
	}
	var reset, tight int64
	for i, r := range rules {
		left := max(r.full-d.fills[i], 0) / r.per
		empty := r.emptyIn(d, i)
		if i == 0 || left < res.Remaining || left == res.Remaining && empty > tight {
			res.Remaining, res.Tightest, tight = left, r.name, empty
		}
		reset = max(reset, empty)
	}
	res.ResetAfter, res.TightestReset = micros(reset), micros(tight)
	return res
}

// emptyIn returns how long, in µs, until rule r, the i-th of d, is empty
// after d.
func (r rule) emptyIn(d decision, i int) int64 {
	switch {
	case r.window > 0:
		return r.windowEmpty(d.logs[i], d.ats[i])
	case r.cal != nil:
		return r.calendarEmpty(d.fills[i], d.ats[i])
	}
	return ceilDiv(d.fills[i], r.leak)
}

// micros converts µs to a Duration, clamped instead of overflowing.
func micros(us int64) time.Duration {
	const most = int64(1<<63-1) / int64(time.Microsecond)
	if us > most {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(us) * time.Microsecond
}
