package funnel_test

import (
	"context"
	"errors"
	"testing"
	"time"
	_ "time/tzdata" // the zones below, with Go alone

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// calendarStep is a call at a server time and what it must answer: admitted
// or not, the wait exactly, the units left and the reset.
type calendarStep struct {
	at        time.Time
	allowed   bool
	retry     time.Duration
	remaining int64
	reset     time.Duration
}

// playCalendar makes the calls of steps on miniredis's clock, with rule
// alone on one key, and checks every answer, and after each admission the
// key's TTL: until the period's end, to the ms rounded up, when the call
// made the key; at least that otherwise (a TTL only grows, and miniredis's
// does not run down with SetTime).
func playCalendar(t *testing.T, rule funnel.Rule, steps []calendarStep) {
	t.Helper()
	b := testutil.Mini(t)
	lim := newLimiter(t, b)
	ctx := context.Background()
	for i, s := range steps {
		b.Mini.SetTime(s.at)
		state := keyspace.Key(b.Prefix, "k", "f")
		made := !b.Mini.Exists(state)
		res, err := lim.Allow(ctx, "k", rule)
		if err != nil {
			t.Fatal(err)
		}
		want := funnel.Result{Allowed: s.allowed, RetryAfter: s.retry, Remaining: s.remaining, Tightest: rule.Name, ResetAfter: s.reset, TightestReset: s.reset}
		if !s.allowed {
			want.Rule = rule.Name
		}
		if res != want {
			t.Fatalf("step %d at %v (%v): %+v, want %+v", i, s.at.UTC(), s.at, res, want)
		}
		if !s.allowed {
			continue
		}
		ttl := b.Mini.TTL(state)
		if want := (s.reset + time.Millisecond - 1).Truncate(time.Millisecond); ttl < want || made && ttl != want {
			t.Fatalf("step %d: TTL %v, want %v (the key made by this call: %v)", i, ttl, want, made)
		}
	}
}

// A day in America/New_York is 23 hours on 2026-03-08 (clocks spring from
// 02:00 to 03:00) and 25 on 2026-11-01 (back from 02:00 to 01:00): the
// budget resets at local midnight each time, 05:00 or 04:00 UTC, and a
// denial's RetryAfter is exactly the time left to it.
func TestPerDayDaylightSaving(t *testing.T) {
	ny := mustZone("America/New_York")
	utc := func(mo time.Month, d, h, m int, us int) time.Time { // us: µs into the minute
		return time.Date(2026, mo, d, h, m, 0, us*1000, time.UTC)
	}
	rule := funnel.PerDay(2, ny)
	if rule.Name != "2 per day (America/New_York)" {
		t.Fatalf("name %q", rule.Name)
	}
	t.Run("23h", func(t *testing.T) {
		playCalendar(t, rule, []calendarStep{
			{at: utc(3, 8, 4, 59, 59_999_999), allowed: true, remaining: 1, reset: time.Microsecond}, // 3/7 23:59:59.999999 EST
			{at: utc(3, 8, 5, 0, 0), allowed: true, remaining: 1, reset: 23 * time.Hour},             // 3/8 00:00 EST
			{at: utc(3, 8, 5, 0, 10), allowed: true, remaining: 0, reset: 23*time.Hour - 10*time.Microsecond},
			{at: utc(3, 8, 12, 0, 0), retry: 16 * time.Hour, reset: 16 * time.Hour},
			{at: utc(3, 9, 3, 59, 59_999_999), retry: time.Microsecond, reset: time.Microsecond}, // 3/8 23:59:59.999999 EDT
			{at: utc(3, 9, 4, 0, 0), allowed: true, remaining: 1, reset: 24 * time.Hour},         // 3/9 00:00 EDT
		})
	})
	t.Run("25h", func(t *testing.T) {
		playCalendar(t, rule, []calendarStep{
			{at: utc(11, 1, 4, 0, 0), allowed: true, remaining: 1, reset: 25 * time.Hour}, // 11/1 00:00 EDT
			{at: utc(11, 1, 6, 30, 0), allowed: true, remaining: 0, reset: 22*time.Hour + 30*time.Minute},
			{at: utc(11, 1, 6, 30, 0), retry: 22*time.Hour + 30*time.Minute, reset: 22*time.Hour + 30*time.Minute}, // 01:30 EST, after 01:30 EDT
			{at: utc(11, 2, 4, 59, 0), retry: time.Minute, reset: time.Minute},                                     // 11/1 23:59 EST
			{at: utc(11, 2, 5, 0, 0), allowed: true, remaining: 1, reset: 24 * time.Hour},
		})
	})
	t.Run("month", func(t *testing.T) { // March 2026: 31 days less the hour sprung
		playCalendar(t, funnel.PerMonth(1, ny), []calendarStep{
			{at: utc(3, 1, 5, 0, 0), allowed: true, remaining: 0, reset: 31*24*time.Hour - time.Hour},
			{at: utc(3, 31, 12, 0, 0), retry: 16 * time.Hour, reset: 16 * time.Hour},
			{at: utc(4, 1, 4, 0, 0), allowed: true, remaining: 0, reset: 30 * 24 * time.Hour},
		})
	})
}

// In America/Havana clocks spring from 00:00 to 01:00 (2026-03-08): that
// date has no midnight. Its day starts when the clock jumps, 01:00 CDT
// (05:00 UTC), and the day before ends then, 24 hours long; the date is
// 23 hours long. (time.Date answers 2026-03-07 23:00 CST for its midnight,
// an hour inside the day before: the rule does not use that answer.) A
// date a zone skips altogether, Pacific/Apia's 2011-12-30, holds no call:
// the 29th ends when the 31st begins.
func TestPerDayMidnightSkipped(t *testing.T) {
	havana := mustZone("America/Havana")
	playCalendar(t, funnel.PerDay(1, havana), []calendarStep{
		{at: time.Date(2026, 3, 8, 4, 30, 0, 0, time.UTC), allowed: true, reset: 30 * time.Minute}, // 3/7 23:30 CST
		{at: time.Date(2026, 3, 8, 4, 59, 0, 0, time.UTC), retry: time.Minute, reset: time.Minute},
		{at: time.Date(2026, 3, 8, 5, 0, 0, 0, time.UTC), allowed: true, reset: 23 * time.Hour}, // 3/8 01:00 CDT
		{at: time.Date(2026, 3, 9, 3, 59, 0, 0, time.UTC), retry: time.Minute, reset: time.Minute},
		{at: time.Date(2026, 3, 9, 4, 0, 0, 0, time.UTC), allowed: true, reset: 24 * time.Hour}, // 3/9 00:00 CDT
	})
	apia := mustZone("Pacific/Apia")
	playCalendar(t, funnel.PerDay(1, apia), []calendarStep{
		{at: time.Date(2011, 12, 30, 9, 0, 0, 0, time.UTC), allowed: true, reset: time.Hour}, // 12/29 23:00 -10
		{at: time.Date(2011, 12, 30, 9, 30, 0, 0, time.UTC), retry: 30 * time.Minute, reset: 30 * time.Minute},
		{at: time.Date(2011, 12, 30, 10, 0, 0, 0, time.UTC), allowed: true, reset: 24 * time.Hour}, // 12/31 00:00 +14
	})
}

// A Local (a guard's FailOpen) counts days of its time: a fixed zone whose
// midnight falls an hour after the test's start resets the budget then,
// exactly, and a refund gives back units of the current day only.
func TestPerDayLocal(t *testing.T) {
	l := funnel.NewLocal(0)
	start := time.Now().Truncate(time.Microsecond)
	midnight := start.Add(time.Hour).Truncate(time.Second)
	off := -int(midnight.Unix() % 86400)
	if off < -43200 {
		off += 86400
	}
	rule := funnel.PerDay(3, time.FixedZone("test", off))
	if rule.Name != "3 per day (test)" {
		t.Fatalf("name %q", rule.Name)
	}
	allow := func(at time.Time, n int64) funnel.Result {
		t.Helper()
		res, err := l.AllowN(at, "k", n, rule)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	left := midnight.Sub(start)
	if res := allow(start, 3); !res.Allowed || res.Remaining != 0 || res.ResetAfter != left {
		t.Fatalf("3 at the start: %+v, want admitted, reset in %v", res, left)
	}
	if res := allow(start, 1); res.Allowed || res.RetryAfter != left || res.Rule != rule.Name {
		t.Fatalf("a 4th: %+v, want denied until midnight, %v", res, left)
	}
	if res := allow(midnight.Add(-time.Microsecond), 1); res.Allowed || res.RetryAfter != time.Microsecond {
		t.Fatalf("a µs before midnight: %+v", res)
	}
	if res := allow(midnight, 2); !res.Allowed || res.Remaining != 1 || res.ResetAfter != 24*time.Hour {
		t.Fatalf("2 at midnight: %+v, want admitted, 1 left", res)
	}
	if _, err := l.AllowN(midnight, "k", 4, rule); !errors.Is(err, funnel.ErrInvalidN) {
		t.Fatalf("4 units of a budget of 3: %v, want ErrInvalidN", err)
	}
}

// Refund gives back units of the current period only, never below 0; a
// count of an earlier day is 0 whatever is stored; a call of more units
// than the budget is ErrInvalidN, as a funnel's beyond its Capacity.
func TestPerDayRefund(t *testing.T) {
	b := testutil.Mini(t)
	lim := newLimiter(t, b)
	ctx := context.Background()
	rule := funnel.PerDay(5, nil)
	if rule.Name != "5 per day (UTC)" {
		t.Fatalf("name %q", rule.Name)
	}
	day := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) { b.Mini.SetTime(day.Add(d)) }
	at(23 * time.Hour)
	if res, err := lim.AllowN(ctx, "k", 4, rule); err != nil || !res.Allowed || res.Remaining != 1 {
		t.Fatalf("4 of 5: %+v, %v", res, err)
	}
	if _, err := lim.AllowN(ctx, "k", 6, rule); !errors.Is(err, funnel.ErrInvalidN) {
		t.Fatalf("6 of 5: %v, want ErrInvalidN", err)
	}
	if err := lim.Refund(ctx, "k", 1, rule); err != nil {
		t.Fatal(err)
	}
	if res, err := lim.Peek(ctx, "k", rule); err != nil || res.Remaining != 2 {
		t.Fatalf("after a refund of 1: %+v, %v", res, err)
	}
	at(25 * time.Hour) // the next day: yesterday's 3 are gone, a refund gives nothing more
	if err := lim.Refund(ctx, "k", 2, rule); err != nil {
		t.Fatal(err)
	}
	if res, err := lim.AllowN(ctx, "k", 5, rule); err != nil || !res.Allowed || res.Remaining != 0 || res.ResetAfter != 23*time.Hour {
		t.Fatalf("5 the next day: %+v, %v", res, err)
	}
	if err := lim.Refund(ctx, "k", 9, rule); err != nil {
		t.Fatal(err)
	}
	if res, err := lim.Peek(ctx, "k", rule); err != nil || res.Remaining != 5 || res.ResetAfter != 0 {
		t.Fatalf("after a refund of 9 of 5: %+v, %v", res, err)
	}
}

// Calendar rules' definitions: a budget of 0 or past 2^61 is refused, and
// the field changes with n, the kind and the zone (a new budget starts at
// 0), not with the time.
func TestCalendarRules(t *testing.T) {
	for _, r := range []funnel.Rule{funnel.PerDay(0, nil), funnel.PerMonth(-1, nil), funnel.PerDay(1<<61+1, time.UTC)} {
		if err := funnel.Validate(r); !errors.Is(err, funnel.ErrInvalidRule) {
			t.Errorf("Validate(%q) = %v, want ErrInvalidRule", r.Name, err)
		}
	}
	if err := funnel.Validate(funnel.PerDay(1<<61, time.UTC), funnel.PerMonth(1, nil), funnel.Window(5, time.Hour), funnel.AtMost(5, time.Hour)); err != nil {
		t.Fatal(err)
	}
	paris := mustZone("Europe/Paris")
	if r := funnel.PerMonth(1000, paris); r.Name != "1000 per month (Europe/Paris)" {
		t.Fatalf("name %q", r.Name)
	}
	b := testutil.Mini(t)
	lim := newLimiter(t, b)
	ctx := context.Background()
	b.Mini.SetTime(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	same := func(r funnel.Rule) funnel.Rule { r.Name = "budget"; return r }
	rules := []funnel.Rule{same(funnel.PerDay(1, nil)), same(funnel.PerDay(2, nil)), same(funnel.PerMonth(1, nil)), same(funnel.PerDay(1, paris))}
	for i, r := range rules {
		res, err := lim.Allow(ctx, "k", r)
		if err != nil || !res.Allowed {
			t.Fatalf("rule %d (%+v): %+v, %v; want a field of its own, empty", i, r, res, err)
		}
	}
	if res, err := lim.Allow(ctx, "k", rules[0]); err != nil || res.Allowed {
		t.Fatalf("rule 0 again: %+v, %v", res, err)
	}
}

// A calendar budget in the penalty box: its denials count like a funnel's,
// the box denies past midnight, the budget decides again after the box, and
// Reset forgets both.
func TestPerDayPenalty(t *testing.T) {
	b := testutil.Mini(t)
	start := time.Date(2026, 11, 23, 23, 50, 0, 0, time.UTC)
	b.Mini.SetTime(start)
	ctx := context.Background()
	rule := funnel.PerDay(1, nil)
	lim := mustLimiter(t, b.Client(t), funnel.WithPrefix(b.Prefix), funnel.WithPenalty(funnel.Penalty{Denials: 3, Within: time.Minute, For: time.Hour}))
	allow := func(at time.Duration) funnel.Result {
		t.Helper()
		b.Mini.SetTime(start.Add(at))
		res, err := lim.Allow(ctx, "k", rule)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := allow(0); !res.Allowed {
		t.Fatalf("first: %+v", res)
	}
	for i := range 2 {
		if res := allow(time.Second); res.Allowed || res.Rule != rule.Name || res.RetryAfter != 10*time.Minute-time.Second {
			t.Fatalf("denial %d: %+v; want the budget's, until midnight", i, res)
		}
	}
	if res := allow(time.Second); res.Rule != funnel.PenaltyRule || res.RetryAfter != time.Hour {
		t.Fatalf("third denial: %+v; want the box for 1h", res)
	}
	if res := allow(11 * time.Minute); res.Rule != funnel.PenaltyRule || res.RetryAfter != 49*time.Minute+time.Second {
		t.Fatalf("after midnight, in the box: %+v", res)
	}
	if res := allow(time.Hour + time.Second); !res.Allowed || res.ResetAfter != 23*time.Hour+10*time.Minute-time.Second {
		t.Fatalf("after the box: %+v; want admitted, the day's budget", res)
	}
	if err := lim.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if res, err := lim.Peek(ctx, "k", rule); err != nil || !res.Allowed || res.Remaining != 1 {
		t.Fatalf("after Reset: %+v, %v", res, err)
	}
}

// Concurrent calls on one key, batched: a budget admits exactly n of them,
// on miniredis and on a real server.
func TestPerDayConcurrent(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		raceToLimit(t, b, []funnel.Rule{funnel.PerDay(37, mustZone("Asia/Shanghai")), funnel.Window(100, time.Hour)})
	})
}

// A call with a calendar rule takes two round trips when admitted, its
// first included (the one-round-trip admission cannot write a calendar's
// gate), and one when the budget is spent: the gate stored with the count
// denies without the lock until midnight.
func TestPerDayRoundTrips(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		lim, counter := countingLimiter(t, b)
		rule := funnel.PerDay(2, mustZone("Europe/Paris"))
		for range 3 { // admitted, admitted, denied: every script loaded
			if _, err := lim.Allow(ctx, "warm-up-day", rule); err != nil {
				t.Fatal(err)
			}
		}
		for i, want := range []struct {
			allowed  bool
			commands int64
		}{{true, 2}, {true, 2}, {false, 1}, {false, 1}} {
			counter.N.Store(0)
			res, err := lim.Allow(ctx, "k", rule)
			if err != nil || res.Allowed != want.allowed {
				t.Fatalf("call %d: %+v, %v; want allowed %v", i, res, err, want.allowed)
			}
			if n := counter.N.Load(); n != want.commands {
				t.Fatalf("call %d: %d commands; want %d", i, n, want.commands)
			}
		}
	})
}
