package funnel

import (
	"strconv"
	"time"
)

// PerDay returns the rule that admits at most n units (at most 2^61) per
// calendar day in the zone loc (nil: UTC), from local midnight to the next
// on the server's clock, whatever the day's length; a denied call can
// retry at the next midnight, exactly. A day whose midnight a clock change
// skips starts when the clock jumps. The days are those of the deciding
// process's zone rules: give every process the same tzdata. A Refund gives
// back units of the current day only. The rule is named like "1000 per day
// (Europe/Paris)"; its Leak is n and its Per 24 hours, not otherwise used.
func PerDay(n int64, loc *time.Location) Rule {
	return calendarRule(n, loc, kindDay, 24*time.Hour)
}

// PerMonth is PerDay for calendar months, from the 1st to the 1st. It is
// named like "50000 per month (UTC)"; its Per is 30 days.
func PerMonth(n int64, loc *time.Location) Rule {
	return calendarRule(n, loc, kindMonth, 30*24*time.Hour)
}

// periods names a calendar rule's period, in its name and its state's.
var periods = [...]string{kindDay: "day", kindMonth: "month"}

func calendarRule(n int64, loc *time.Location, kind ruleKind, nominal time.Duration) Rule {
	if loc == nil {
		loc = time.UTC
	}
	name := strconv.FormatInt(n, 10) + " per " + periods[kind] + " (" + loc.String() + ")"
	return Rule{Name: name, Capacity: n, Leak: n, Per: nominal, kind: kind, loc: loc}
}

func (r Rule) compileCalendar() rule {
	c := &calendar{loc: r.loc, month: r.kind == kindMonth} // calendarRule set loc
	id := fieldOf(r.stateName(r.Name + "/" + periods[r.kind] + "/" + strconv.FormatInt(r.Capacity, 10) + "/" + c.loc.String()))
	return rule{name: r.Name, id: id, arg: id, per: 1, full: r.Capacity, leak: 1, cal: c, shared: r.shared}
}

// A calendar is the zone and length (a day or a month) of a calendar rule's
// periods. A period runs from the start of a local date to the start of
// the next: the first instant whose local date is that date or later.
type calendar struct {
	loc   *time.Location
	month bool
}

// maxZoneSteps bounds the zone changes walked around one date.
const maxZoneSteps = 16

// period returns the period that holds t (µs of Unix time): [start, end).
func (c *calendar) period(t int64) (start, end int64) {
	y, m, d := time.UnixMicro(t).In(c.loc).Date()
	if c.month {
		d = 1
	}
	start, end = c.startOf(y, m, d), c.startOf(c.next(y, m, d))
	// A clock set back across midnight shows the day before again: that
	// time belongs to the next period.
	for range maxZoneSteps {
		if end > t {
			break
		}
		y, m, d = c.next(y, m, d)
		start, end = end, c.startOf(c.next(y, m, d))
	}
	return start, end
}

func (c *calendar) next(y int, m time.Month, d int) (int, time.Month, int) {
	if c.month {
		return time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC).Date()
	}
	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC).Date()
}

// startOf returns the start of the local date y-m-d (µs). time.Date may
// answer either side of a change at midnight; this walks the zone's
// offsets from a day before: within offset o the date has begun from
// midnight - o on, so it starts there or where the offset changes.
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

// count returns the units in s of t's period (t >= s.at).
func (c *calendar) count(s level, t int64) int64 {
	if start, _ := c.period(t); s.at < start {
		return 0
	}
	return s.fill
}
