package funnel_test

import (
	"fmt"
	"math/big"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
)

// refRule is the exact model of one rule: its funnel held level units (a
// rational) at time at (µs) and drains rate units per µs. A Window rule's
// model is a sliding log instead: units holds the time of every unit ever
// taken and not refunded, and a unit taken at t counts at now while
// now < t + win. A calendar rule's model counts the units of the local date
// (or month) of the last call, found by formatting each instant in the zone.
type refRule struct {
	c     *big.Rat // Capacity
	rate  *big.Rat // Leak / Per
	level *big.Rat
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

func newRefRule(r funnel.Rule) *refRule {
	m := &refRule{
		c:     new(big.Rat).SetInt64(r.Capacity),
		rate:  big.NewRat(r.Leak, r.Per.Microseconds()),
		level: new(big.Rat),
	}
	if funnel.IsWindow(r) {
		m.win = r.Per.Microseconds()
	}
	m.loc, m.month, _ = funnel.Calendar(r)
	return m
}

// periodOf names the calendar period of now: its local date, or month.
func (m *refRule) periodOf(now int64) string {
	layout := "2006-01-02"
	if m.month {
		layout = "2006-01"
	}
	return time.UnixMicro(m.base + now).In(m.loc).Format(layout)
}

// countAt is a calendar rule's count at now: 0 in a period after the
// count's.
func (m *refRule) countAt(now int64) int64 {
	if m.periodOf(now) != m.period {
		return 0
	}
	return m.count
}

// nextPeriod returns the first µs after now in another period than now's:
// by bisection on the local date of each instant, which the zones the
// tests use never set back across midnight.
func (m *refRule) nextPeriod(now int64) int64 {
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
func (m *refRule) inWindow(now int64) []int64 {
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
func (m *refRule) levelAt(now int64) *big.Rat {
	if now < m.at {
		panic(fmt.Sprintf("model time went back from %d to %d", m.at, now))
	}
	if m.win > 0 {
		return new(big.Rat).SetInt64(int64(len(m.inWindow(now))))
	}
	if m.loc != nil {
		return new(big.Rat).SetInt64(m.countAt(now))
	}
	leaked := new(big.Rat).Mul(m.rate, new(big.Rat).SetInt64(now-m.at))
	l := new(big.Rat).Sub(m.level, leaked)
	if l.Sign() < 0 {
		l.SetInt64(0)
	}
	return l
}

// slack is the room left at now after n more units: negative when they do
// not fit.
func (m *refRule) slack(now, n int64) *big.Rat {
	s := new(big.Rat).Sub(m.c, m.levelAt(now))
	return s.Sub(s, new(big.Rat).SetInt64(n))
}

// wait is the exact time in µs from now until n more units fit.
func (m *refRule) wait(now, n int64) *big.Rat {
	s := m.slack(now, n)
	if s.Sign() >= 0 {
		return new(big.Rat)
	}
	if m.win > 0 { // by brute force: the first µs at which they fit
		in := m.inWindow(now)
		for _, t := range in {
			if m.slack(t+m.win, n).Sign() >= 0 {
				return new(big.Rat).SetInt64(t + m.win - now)
			}
		}
		panic("a window never has room")
	}
	if m.loc != nil { // n is at most the rule's n: it fits in the next period
		return new(big.Rat).SetInt64(m.nextPeriod(now) - now)
	}
	s.Neg(s)
	return s.Quo(s, m.rate)
}

// take adds n units at now.
func (m *refRule) take(now, n int64) {
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
	m.level = m.levelAt(now)
	m.level.Add(m.level, new(big.Rat).SetInt64(n))
	m.at = now
}

// refKey is the model of the rules of one key: all or nothing.
type refKey []*refRule

func newRefKey(rules []funnel.Rule) refKey {
	k := make(refKey, len(rules))
	for i, r := range rules {
		k[i] = newRefRule(r)
	}
	return k
}

// since sets the Unix time in µs of k's time 0, which calendar rules count
// their periods by (0 by default: k's times are Unix times).
func (k refKey) since(base int64) refKey {
	for _, m := range k {
		m.base = base
	}
	return k
}

// admits reports whether n units fit in every rule at now.
func (k refKey) admits(now, n int64) bool {
	for _, m := range k {
		if m.slack(now, n).Sign() < 0 {
			return false
		}
	}
	return true
}

// waits returns each rule's wait for n units at now rounded up to the µs,
// and the longest.
func (k refKey) waits(now, n int64) (waits []int64, most int64) {
	waits = make([]int64, len(k))
	for i, m := range k {
		waits[i] = ratCeil(m.wait(now, n))
		most = max(most, waits[i])
	}
	return waits, most
}

// remaining returns the whole units each rule would still admit at now, and
// the fewest.
func (k refKey) remaining(now int64) (left []int64, least int64) {
	left = make([]int64, len(k))
	for i, m := range k {
		left[i] = ratFloor(new(big.Rat).Sub(m.c, m.levelAt(now)))
		if i == 0 || left[i] < least {
			least = left[i]
		}
	}
	return left, least
}

// refund gives n units back at now: a funnel's level drops by n, down to
// empty; a window forgets its newest n units still in it.
func (m *refRule) refund(now, n int64) {
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
	m.level, m.at = l, now
}

func (k refKey) refund(now, n int64) {
	for _, m := range k {
		m.refund(now, n)
	}
}

// reset is the time until every rule is empty, rounded up to the µs.
func (k refKey) reset(now int64) int64 {
	var most int64
	for _, m := range k {
		most = max(most, m.empty(now))
	}
	return most
}

// empty is the time until the rule is empty, rounded up to the µs: a
// window's newest unit leaves it, a funnel has drained.
func (m *refRule) empty(now int64) int64 {
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
	return ratCeil(l.Quo(l, m.rate))
}

// tightest returns the index of the rule with the fewest whole units left
// at now; among several, the one empty last, then the first; and how long
// until it is empty.
func (k refKey) tightest(now int64) (i int, empty int64) {
	left, least := k.remaining(now)
	i = -1
	for j, m := range k {
		if e := m.empty(now); left[j] == least && (i < 0 || e > empty) {
			i, empty = j, e
		}
	}
	return i, empty
}

func (k refKey) take(now, n int64) {
	for _, m := range k {
		m.take(now, n)
	}
}

// ratCeil returns ⌈r⌉ for r >= 0.
func ratCeil(r *big.Rat) int64 {
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

// ratFloor returns ⌊r⌋ for r >= 0.
func ratFloor(r *big.Rat) int64 {
	return new(big.Int).Quo(r.Num(), r.Denom()).Int64()
}
