package funnelmodel

import (
	"fmt"
	"math/big"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
)

// Rule is the exact model of one rule: its funnel held level units (a
// rational) at time at (µs) and drains rate units per µs. A Window rule's
// model is a sliding log instead: units holds the time of every unit ever
// taken and not refunded, and a unit taken at t counts at now while
// now < t + win. A calendar rule's model counts the units of the local date
// (or month) of the last call, found by formatting each instant in the zone.
type Rule struct {
	c     *big.Rat // Capacity
	Rate  *big.Rat // Leak / Per
	Level *big.Rat
	at    int64

	win   int64 // µs; 0 for a funnel
	units []int64

	// A calendar rule's model (loc non-nil): count units were taken in the
	// period named period (its local date, "2026-03-08", or month); base
	// is the Unix time in µs of the model's time 0.
	loc    *time.Location
	month  bool
	base   int64
	count  int64
	period string
}

// Kind is what a rule counts, which funnel.Rule keeps to itself: a funnel
// (the zero Kind), a sliding window, or a calendar day or month in Zone.
// funnel's own tests read it from the rule (export_test.go).
type Kind struct {
	Window bool
	Zone   *time.Location // a calendar rule's zone; nil otherwise
	Month  bool           // a calendar rule counts months, not days
}

// NewRule returns the model of r, of kind k, empty at time 0.
func NewRule(r funnel.Rule, k Kind) *Rule {
	m := &Rule{
		c:     new(big.Rat).SetInt64(r.Capacity),
		Rate:  big.NewRat(r.Leak, r.Per.Microseconds()),
		Level: new(big.Rat),
		loc:   k.Zone,
		month: k.Month,
	}
	if k.Window {
		m.win = r.Per.Microseconds()
	}
	return m
}

// periodOf names the calendar period of now: its local date, or month.
func (m *Rule) periodOf(now int64) string {
	layout := "2006-01-02"
	if m.month {
		layout = "2006-01"
	}
	return time.UnixMicro(m.base + now).In(m.loc).Format(layout)
}

// countAt is a calendar rule's count at now: 0 in a period after the
// count's.
func (m *Rule) countAt(now int64) int64 {
	if m.periodOf(now) != m.period {
		return 0
	}
	return m.count
}

// nextPeriod returns the first µs after now in another period than now's:
// by bisection on the local date of each instant, which the zones the
// tests use never set back across midnight.
func (m *Rule) nextPeriod(now int64) int64 {
	p := m.periodOf(now)
	lo, hi := now, now+1 // periodOf(lo) == p, periodOf(hi) != p
	for m.periodOf(hi) == p {
		lo, hi = hi, hi+(hi-now)*2
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if m.periodOf(mid) == p {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

// inWindow returns the units of a window counted at now, oldest first.
func (m *Rule) inWindow(now int64) []int64 {
	var in []int64
	for _, t := range m.units {
		if t <= now && now < t+m.win {
			in = append(in, t)
		}
	}
	return in
}

// levelAt is the level at now >= at: what leaked since at is gone, down to
// empty (a window: its units counted at now).
func (m *Rule) levelAt(now int64) *big.Rat {
	if now < m.at {
		panic(fmt.Sprintf("model time went back from %d to %d", m.at, now))
	}
	if m.win > 0 {
		return new(big.Rat).SetInt64(int64(len(m.inWindow(now))))
	}
	if m.loc != nil {
		return new(big.Rat).SetInt64(m.countAt(now))
	}
	leaked := new(big.Rat).Mul(m.Rate, new(big.Rat).SetInt64(now-m.at))
	l := new(big.Rat).Sub(m.Level, leaked)
	if l.Sign() < 0 {
		l.SetInt64(0)
	}
	return l
}

// Slack is the room left at now after n more units: negative when they do
// not fit.
func (m *Rule) Slack(now, n int64) *big.Rat {
	s := new(big.Rat).Sub(m.c, m.levelAt(now))
	return s.Sub(s, new(big.Rat).SetInt64(n))
}

// wait is the exact time in µs from now until n more units fit.
func (m *Rule) wait(now, n int64) *big.Rat {
	s := m.Slack(now, n)
	if s.Sign() >= 0 {
		return new(big.Rat)
	}
	if m.win > 0 { // by brute force: the first µs at which they fit
		in := m.inWindow(now)
		for _, t := range in {
			if m.Slack(t+m.win, n).Sign() >= 0 {
				return new(big.Rat).SetInt64(t + m.win - now)
			}
		}
		panic("a window never has room")
	}
	if m.loc != nil { // n is at most the rule's n: it fits in the next period
		return new(big.Rat).SetInt64(m.nextPeriod(now) - now)
	}
	s.Neg(s)
	return s.Quo(s, m.Rate)
}

// Take adds n units at now.
func (m *Rule) Take(now, n int64) {
	if m.win > 0 {
		for range n {
			m.units = append(m.units, now)
		}
		m.at = now
		return
	}
	if m.loc != nil {
		m.count, m.period, m.at = m.countAt(now)+n, m.periodOf(now), now
		return
	}
	m.Level = m.levelAt(now)
	m.Level.Add(m.Level, new(big.Rat).SetInt64(n))
	m.at = now
}

// Key is the model of the rules of one key: all or nothing.
type Key []*Rule

// NewKey returns the model of rules, each of the kind kindOf gives.
func NewKey(rules []funnel.Rule, kindOf func(funnel.Rule) Kind) Key {
	k := make(Key, len(rules))
	for i, r := range rules {
		k[i] = NewRule(r, kindOf(r))
	}
	return k
}

// Since sets the Unix time in µs of k's time 0, which calendar rules count
// their periods by (0 by default: k's times are Unix times).
func (k Key) Since(base int64) Key {
	for _, m := range k {
		m.base = base
	}
	return k
}

// Admits reports whether n units fit in every rule at now.
func (k Key) Admits(now, n int64) bool {
	for _, m := range k {
		if m.Slack(now, n).Sign() < 0 {
			return false
		}
	}
	return true
}

// Waits returns each rule's wait for n units at now rounded up to the µs,
// and the longest.
func (k Key) Waits(now, n int64) (waits []int64, most int64) {
	waits = make([]int64, len(k))
	for i, m := range k {
		waits[i] = RatCeil(m.wait(now, n))
		most = max(most, waits[i])
	}
	return waits, most
}

// Remaining returns the whole units each rule would still admit at now, and
// the fewest.
func (k Key) Remaining(now int64) (left []int64, least int64) {
	left = make([]int64, len(k))
	for i, m := range k {
		left[i] = RatFloor(new(big.Rat).Sub(m.c, m.levelAt(now)))
		if i == 0 || left[i] < least {
			least = left[i]
		}
	}
	return left, least
}

// Refund gives n units back at now: a funnel's level drops by n, down to
// empty; a window forgets its newest n units still in it.
func (m *Rule) Refund(now, n int64) {
	if m.win > 0 {
		in := m.inWindow(now)
		m.units = in[:len(in)-int(min(n, int64(len(in))))]
		m.at = now
		return
	}
	if m.loc != nil {
		m.count, m.period, m.at = max(m.countAt(now)-n, 0), m.periodOf(now), now
		return
	}
	l := m.levelAt(now)
	l.Sub(l, new(big.Rat).SetInt64(n))
	if l.Sign() < 0 {
		l.SetInt64(0)
	}
	m.Level, m.at = l, now
}

// Refund gives n units back to every rule of k at now.
func (k Key) Refund(now, n int64) {
	for _, m := range k {
		m.Refund(now, n)
	}
}

// Reset is the time until every rule is empty, rounded up to the µs.
func (k Key) Reset(now int64) int64 {
	var most int64
	for _, m := range k {
		most = max(most, m.empty(now))
	}
	return most
}

// empty is the time until the rule is empty, rounded up to the µs: a
// window's newest unit leaves it, a funnel has drained.
func (m *Rule) empty(now int64) int64 {
	if m.win > 0 {
		if in := m.inWindow(now); len(in) > 0 {
			return in[len(in)-1] + m.win - now
		}
		return 0
	}
	if m.loc != nil {
		if m.countAt(now) > 0 {
			return m.nextPeriod(now) - now
		}
		return 0
	}
	l := m.levelAt(now)
	return RatCeil(l.Quo(l, m.Rate))
}

// Tightest returns the index of the rule with the fewest whole units left
// at now; among several, the one empty last, then the first; and how long
// until it is empty.
func (k Key) Tightest(now int64) (i int, empty int64) {
	left, least := k.Remaining(now)
	i = -1
	for j, m := range k {
		if e := m.empty(now); left[j] == least && (i < 0 || e > empty) {
			i, empty = j, e
		}
	}
	return i, empty
}

// Take takes n units from every rule of k at now.
func (k Key) Take(now, n int64) {
	for _, m := range k {
		m.Take(now, n)
	}
}

// RatCeil returns ⌈r⌉ for r >= 0.
func RatCeil(r *big.Rat) int64 {
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

// RatFloor returns ⌊r⌋ for r >= 0.
func RatFloor(r *big.Rat) int64 {
	return new(big.Int).Quo(r.Num(), r.Denom()).Int64()
}

// NewPeriods counts the calendar rules of k that hold units of a period
// that has ended by now.
func (k Key) NewPeriods(now int64) int {
	n := 0
	for _, m := range k {
		if m.loc != nil && m.count > 0 && m.periodOf(now) != m.period {
			n++
		}
	}
	return n
}

// Straddles reports whether a calendar rule of k changes periods between
// before and after: a Peek's time found from its ResetAfter there is not
// where the model would look for it.
func (k Key) Straddles(before, after int64) bool {
	for _, m := range k {
		if m.loc != nil && m.periodOf(before) != m.periodOf(after) {
			return true
		}
	}
	return false
}
