package funnel

import (
	"strconv"
	"time"
)

// PerDay returns the rule that admits at most n units per calendar day in
// the zone loc (nil: UTC): a budget, counted from local midnight to the next
// local midnight on the server's clock (Redis TIME), whatever the length of
// the day: 23 or 25 hours across a daylight saving change. A call denied by
// it can retry when the next day starts (RetryAfter, exact to the
// microsecond); a Refund gives back units of the current day only. A call of
// more than n units is refused with ErrInvalidN, as one of more than a
// funnel's Capacity is.
//
// A day that a clock change starts late (a zone whose clocks jump from
// 00:00 to 01:00) starts when the clock jumps, and a date a zone skips
// altogether never holds a call; see the package documentation. The days
// are those of the zone rules (tzdata) of the process that decides: give
// every process the same ones (import time/tzdata, or keep the system's in
// step), or a day may start an hour apart in two of them after a zone's
// rules changed.
//
// Its state is the count of the current day and the time of its last
// change, in the key's hash, decided with the key's other rules, all or
// nothing; the key lives until the day's end. n must be at most 2^61. The
// rule is named like "1000 per day (Europe/Paris)"; its field in the state
// changes with n and the zone's name, so a changed budget starts at 0. Its
// Leak is n and its Per 24 hours, so that Capacity * Per / Leak (a guard's
// RateLimit-Policy window) is a day; they are not otherwise used.
//
// The first call of a key with a calendar rule takes the two round trips of
// an admission (the one-round-trip admission of a key without state does
// not apply: it does not know the server's time before it runs, and the
// day's end sets the state's gate and TTL).
func PerDay(n int64, loc *time.Location) Rule {
	return calendarRule(n, loc, kindDay, "day", 24*time.Hour)
}

// PerMonth returns the rule that admits at most n units per calendar month
// in the zone loc (nil: UTC), from the start of the 1st (local midnight) to
// the start of the next month's 1st, as PerDay does for days. It is named
// like "50000 per month (UTC)"; its Leak is n and its Per 30 days.
func PerMonth(n int64, loc *time.Location) Rule {
	return calendarRule(n, loc, kindMonth, "month", 30*24*time.Hour)
}

// calendarRule returns the calendar rule of n units per period of kind.
func calendarRule(n int64, loc *time.Location, kind ruleKind, period string, nominal time.Duration) Rule {
	if loc == nil {
		loc = time.UTC
	}
	name := strconv.FormatInt(n, 10) + " per " + period + " (" + loc.String() + ")"
	return Rule{Name: name, Capacity: n, Leak: n, Per: nominal, kind: kind, loc: loc}
}

// compileCalendar returns r, a valid calendar rule, in exact units. Its
// field names its kind, n and zone.
func (r Rule) compileCalendar() rule {
	c := &calendar{loc: r.loc, month: r.kind == kindMonth}
	if c.loc == nil {
		c.loc = time.UTC
	}
	kind := "/day/"
	if c.month {
		kind = "/month/"
	}
	id := fieldOf(r.stateName(r.Name + kind + strconv.FormatInt(r.Capacity, 10) + "/" + c.loc.String()))
	return rule{name: r.Name, id: id, arg: id, per: 1, full: r.Capacity, leak: 1, cal: c, shared: r.shared}
}

// A calendar is the zone and the length (a day or a month) of a PerDay or
// PerMonth rule's periods. A period runs from the start of a local date
// (the 1st of a month for a month) to the start of the next one: the start
// of a date is the first instant whose local date is that date or later.
// That is its midnight, but on a date whose midnight a clock change skips
// (a zone that moves from 00:00 to 01:00): there the date starts when the
// clock jumps, at 01:00 new time, and the day before ends then. A day is
// thus 23 or 25 hours long across a one-hour change, and a date a zone
// skips altogether (Pacific/Apia, 2011-12-30) is a period of no time that
// no call falls in.
type calendar struct {
	loc   *time.Location
	month bool
}

// maxZoneSteps bounds the zones walked to find a date's start: a few
// hours around it, which real zones change at most twice.
const maxZoneSteps = 16

// period returns the period that holds t (µs of Unix time): [start, end).
func (c *calendar) period(t int64) (start, end int64) {
	y, m, d := time.UnixMicro(t).In(c.loc).Date()
	if c.month {
		d = 1
	}
	start, end = c.startOf(y, m, d), c.startOf(c.next(y, m, d))
	// A clock set back across midnight shows the day before again after
	// the next date began: that time belongs to the next period.
	for range maxZoneSteps {
		if end > t {
			break
		}
		y, m, d = c.next(y, m, d)
		start, end = end, c.startOf(c.next(y, m, d))
	}
	return start, end
}

// next returns the date of the period after the one that starts on y-m-d.
func (c *calendar) next(y int, m time.Month, d int) (int, time.Month, int) {
	if c.month {
		return time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC).Date()
	}
	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC).Date()
}

// startOf returns the start of the local date y-m-d (µs): the first instant
// whose local date is y-m-d or later. time.Date may answer with either side
// of a clock change at midnight; this walks the zone's offsets from a day
// before instead. Within one offset o the local date is y-m-d or later from
// midnight - o on, so the start is there, or where the offset changes.
func (c *calendar) startOf(y int, m time.Month, d int) int64 {
	midnight := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() // local wall time, as if UTC
	x := time.Unix(midnight-48*3600, 0).In(c.loc)               // before the midnight of any offset under 48 h
	for range maxZoneSteps {
		_, off := x.Zone()
		at := max(x.Unix(), midnight-int64(off))
		_, end := x.ZoneBounds()
		if end.IsZero() || at < end.Unix() {
			return at * 1e6
		}
		x = end.In(c.loc)
	}
	return time.Date(y, m, d, 0, 0, 0, 0, c.loc).UnixMicro() // a zone changing every hour
}

// count returns the units of a calendar rule at t >= s.at in the state s:
// those of t's period; a count of another period is 0.
func (c *calendar) count(s level, t int64) int64 {
	if s.fill <= 0 {
		return 0
	}
	if start, _ := c.period(t); s.at < start {
		return 0
	}
	return s.fill
}
