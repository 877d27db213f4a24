package funnel_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

func TestQuota(t *testing.T) {
	maxSecs := time.Duration(math.MaxInt64).Truncate(time.Second)
	for _, tc := range []struct {
		r funnel.Rule
		q int64
		w time.Duration
	}{
		{funnel.AtMost(1, time.Minute), 1, time.Minute},
		{funnel.AtMost(5, time.Hour), 5, time.Hour},
		{funnel.AtMost(10, 24*time.Hour), 10, 24 * time.Hour},
		{funnel.Window(5, time.Hour), 5, time.Hour},
		{funnel.Window(10, 24*time.Hour), 10, 24 * time.Hour},
		{funnel.Window(3, 1500*time.Millisecond), 3, 1500 * time.Millisecond},
		// 10 at once, then one every 100ms: the 10th of those is 1s later.
		{funnel.Rule{Name: "f", Capacity: 10, Leak: 10, Per: time.Second}, 19, time.Second},
		{funnel.Rule{Name: "f", Capacity: 3, Leak: 2, Per: time.Hour}, 4, time.Hour},
		// The Rule doc's "5 per hour" of Capacity 5: 5 at once, then every 12m.
		{funnel.Rule{Name: "f", Capacity: 5, Leak: 5, Per: time.Hour}, 9, time.Hour},
		// w rounds up to whole seconds; the leak within it counts.
		{funnel.AtMost(3, 1500*time.Millisecond), 4, 2 * time.Second},
		{funnel.Rule{Name: "f", Capacity: 2, Leak: 1, Per: 300 * time.Millisecond}, 5, time.Second},
		{funnel.Rule{Name: "f", Capacity: 1, Leak: 1, Per: time.Microsecond}, 1_000_000, time.Second},
		// Several units a µs: whole µs admit fewer than continuous time
		// would (1 + ⌈4e6/3⌉ - 1 = 1333334; 2 + 3e6 - 1).
		{funnel.Rule{Name: "f", Capacity: 1, Leak: 4, Per: 3 * time.Microsecond}, 1_333_333, time.Second},
		{funnel.Rule{Name: "f", Capacity: 2, Leak: 3, Per: time.Microsecond}, 2_999_999, time.Second},
		// Overflow: Leak*(w-1µs) past 2^64, past 2^63, and Capacity plus
		// the leak past 2^63, clamp q; a Per past the largest whole second
		// clamps w (which holds less than one leak).
		{funnel.Rule{Name: "f", Capacity: 1, Leak: 1 << 61, Per: time.Microsecond}, math.MaxInt64, time.Second},
		{funnel.Rule{Name: "f", Capacity: 1, Leak: 10_000_000_000_000, Per: time.Microsecond}, math.MaxInt64, time.Second},
		{funnel.Rule{Name: "f", Capacity: 1 << 61, Leak: 7_000_000_000_000, Per: time.Microsecond}, math.MaxInt64, time.Second},
		{funnel.Rule{Name: "f", Capacity: 1 << 60, Leak: 1_000_000_000_000, Per: time.Microsecond}, 1<<60 + 999_999_000_000_000_000, time.Second},
		{funnel.Rule{Name: "f", Capacity: 1, Leak: 1, Per: time.Duration(math.MaxInt64).Truncate(time.Microsecond)}, 1, maxSecs},
		{funnel.Rule{Name: "f", Capacity: 2, Leak: 1, Per: maxSecs}, 2, maxSecs},
		{funnel.Rule{Name: "f", Capacity: 2, Leak: 1, Per: maxSecs - time.Microsecond}, 3, maxSecs},
		// Invalid rules have no quota.
		{funnel.Rule{}, 0, 0},
		{funnel.Rule{Name: "f", Capacity: 0, Leak: 1, Per: time.Second}, 0, 0},
		{funnel.Rule{Name: "f", Capacity: 1, Leak: 0, Per: time.Second}, 0, 0},
		{funnel.Rule{Name: "f", Capacity: 1, Leak: 1, Per: 1500 * time.Nanosecond}, 0, 0},
		{funnel.Rule{Name: "f", Capacity: 1 << 40, Leak: 1, Per: time.Hour}, 0, 0},
		{funnel.Window(0, time.Second), 0, 0},
		{funnel.Window(funnel.MaxWindow+1, time.Second), 0, 0},
	} {
		at := time.Date(2026, 3, 29, 1, 30, 0, 0, time.UTC)
		q, w := tc.r.Quota(at)
		if q != tc.q || w != tc.w {
			t.Errorf("%+v.Quota = %d per %v, want %d per %v", tc.r, q, w, tc.q, tc.w)
		}
		if q2, w2 := tc.r.Quota(at.Add(12 * time.Hour)); q2 != q || w2 != w {
			t.Errorf("%+v.Quota depends on the time: %d per %v, then %d per %v", tc.r, q, w, q2, w2)
		}
	}
}

// Quota's q is the most a rule admits in a window of w, on the Local's
// arithmetic (the Limiter's): from empty, a greedy schedule (all that fits,
// as often as needed to keep a funnel from running empty) gets exactly q
// through within w and not one more, and no schedule of random calls gets
// more than q through in any window of w.
func TestQuotaIsTheBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 3))
	reached := 0
	defer func() { t.Logf("random calls reached q in %d of 300 rules", reached) }()
	for i := range 300 {
		r := quotaRule(rng, i)
		l := funnel.NewLocal(0)
		base := time.Now() // not before the Local's start
		at := func(us int64) time.Time { return base.Add(time.Duration(us) * time.Microsecond) }
		q, w := r.Quota(base)
		wus := w.Microseconds()
		if got := greedy(t, l, r, at, wus-1); got != q {
			t.Fatalf("%+v: a greedy schedule got %d through within %v, Quota says %d", r, got, w, q)
		}
		if res, err := l.AllowN(at(wus-1), "k", 1, r); err != nil || res.Allowed {
			t.Fatalf("%+v: unit %d within %v: %+v, %v", r, q+1, w, res, err)
		}
		l = funnel.NewLocal(0)
		base = time.Now()
		most := mostInWindow(t, rng, l, r, at, wus, q)
		if most == q {
			reached++
		}
		if most > q {
			t.Fatalf("%+v: %d admitted within %v, Quota says %d", r, most, w, q)
		}
	}
}

// mostInWindow makes random calls of 1 to Capacity units on l, empty, for
// three windows of wus µs, about q units a window, and returns the most units
// admitted in any window of wus.
func mostInWindow(t *testing.T, rng *rand.Rand, l *funnel.Local, r funnel.Rule, at func(int64) time.Time, wus, q int64) int64 {
	t.Helper()
	type call struct{ at, n int64 }
	var taken []call
	for now := int64(0); now < 3*wus; now += rng.Int64N(wus*r.Capacity/q + 1) {
		n := 1 + rng.Int64N(r.Capacity)
		res, err := l.AllowN(at(now), "k", n, r)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			taken = append(taken, call{now, n})
		}
	}
	var most, sum int64
	k := 0
	for _, c := range taken { // the window [c.at, c.at+wus)
		for ; k < len(taken) && taken[k].at < c.at+wus; k++ {
			sum += taken[k].n
		}
		most = max(most, sum)
		sum -= c.n
	}
	return most
}

// quotaRule returns a random rule with a quota of at most a few thousand
// units: funnels with Per of whole seconds and not, a few windows, and a
// funnel that leaks several units a µs.
func quotaRule(rng *rand.Rand, i int) funnel.Rule {
	c := 2 + rng.Int64N(20)
	switch i % 6 {
	case 0:
		return funnel.Window(1+rng.Int64N(20), time.Duration(1+rng.Int64N(3_000_000))*time.Microsecond)
	case 1:
		return funnel.Rule{Name: "f", Capacity: c, Leak: 1 + rng.Int64N(10), Per: time.Duration(1+rng.Int64N(3)) * time.Second}
	case 2:
		return funnel.Rule{Name: "f", Capacity: 100_000 + rng.Int64N(1000), Leak: 3 + rng.Int64N(5), Per: time.Duration(1+rng.Int64N(3)) * time.Microsecond}
	}
	return funnel.Rule{Name: "f", Capacity: c, Leak: 1 + rng.Int64N(10), Per: time.Duration(10_000+rng.Int64N(3_000_000)) * time.Microsecond}
}

// greedy admits for key "k" of l, empty, all that fits in r at 0 and then
// at steps that leave a funnel never empty, until last (µs), and returns
// how many units it admitted.
func greedy(t *testing.T, l *funnel.Local, r funnel.Rule, at func(int64) time.Time, last int64) int64 {
	t.Helper()
	step := max((r.Capacity-1)*r.Per.Microseconds()/r.Leak, 1)
	var total int64
	for now := int64(0); ; now = min(now+step, last) {
		res, err := l.AllowN(at(now), "k", 1, r)
		if err != nil {
			t.Fatal(err)
		}
		for res.Allowed {
			total++
			n := max(res.Remaining, 1)
			if res, err = l.AllowN(at(now), "k", n, r); err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				total += n - 1
			}
		}
		if now == last {
			return total
		}
	}
}

// TightestReset is exact to the µs, for funnels and windows, on the
// server's clock: the README's policy over a day, and a funnel whose drain
// ends within a µs.
func TestTightestReset(t *testing.T) {
	b := testutil.Mini(t)
	lim := newLimiter(t, b)
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rules := []funnel.Rule{funnel.AtMost(1, time.Minute), funnel.Window(5, time.Hour), funnel.Window(10, 24*time.Hour)}
	for i, step := range []struct {
		at         time.Duration
		allowed    bool
		tightest   string
		left       int64
		reset      time.Duration // TightestReset
		resetAfter time.Duration
	}{
		{0, true, "1/1m0s", 0, time.Minute, 24 * time.Hour},
		{30 * time.Second, false, "1/1m0s", 0, 30 * time.Second, 24*time.Hour - 30*time.Second},
		{time.Minute + time.Microsecond, true, "1/1m0s", 0, time.Minute, 24 * time.Hour},
		{3 * time.Minute, true, "1/1m0s", 0, time.Minute, 24 * time.Hour},
		{4 * time.Minute, true, "1/1m0s", 0, time.Minute, 24 * time.Hour},
		// The hour is full: 0 left there too, and its newest unit leaves
		// last. The cooldown's minute is over at 6m: the hour alone is 0.
		{5 * time.Minute, true, "5 in 1h0m0s", 0, time.Hour, 24 * time.Hour},
		{6 * time.Minute, false, "5 in 1h0m0s", 0, 59 * time.Minute, 24*time.Hour - time.Minute},
		// The oldest unit leaves at 1h exactly, and the hour is full again.
		{time.Hour, true, "5 in 1h0m0s", 0, time.Hour, 24 * time.Hour},
		{time.Hour + time.Minute + time.Microsecond, true, "5 in 1h0m0s", 0, time.Hour, 24 * time.Hour},
		{time.Hour + 5*time.Minute, true, "1/1m0s", 0, time.Minute, 24 * time.Hour},
	} {
		b.Mini.SetTime(t0.Add(step.at))
		res, err := lim.Allow(ctx, "readme", rules...)
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprint(res.Allowed, res.Tightest, res.Remaining, res.TightestReset, res.ResetAfter)
		if want := fmt.Sprint(step.allowed, step.tightest, step.left, step.reset, step.resetAfter); got != want {
			t.Fatalf("step %d at +%v: %s, want %s (%+v)", i, step.at, got, want, res)
		}
	}
	// 2 per 1s leaking 3 per second: one unit drains in 333333.3µs.
	f := funnel.Rule{Name: "f", Capacity: 2, Leak: 3, Per: time.Second}
	b.Mini.SetTime(t0)
	if res, err := lim.Allow(ctx, "f", f); err != nil || res.TightestReset != 333334*time.Microsecond || res.ResetAfter != res.TightestReset {
		t.Fatalf("one unit of %+v: %+v, %v; want TightestReset 333334µs", f, res, err)
	}
	b.Mini.SetTime(t0.Add(100 * time.Millisecond))
	if res, err := lim.AllowN(ctx, "f", 1, f); err != nil || res.TightestReset != 566667*time.Microsecond {
		t.Fatalf("a second unit 100ms later: %+v, %v; want TightestReset 566667µs", res, err)
	}
}

// A calendar rule's quota is its n per the length of the day or month that
// holds at: 23 and 25 hours on New York's clock-change days, 24 otherwise,
// and March 2026 is 31 days less the hour sprung.
func TestQuotaCalendar(t *testing.T) {
	ny := mustZone("America/New_York")
	at := func(mo time.Month, d int) time.Time { return time.Date(2026, mo, d, 12, 0, 0, 0, ny) }
	for _, tc := range []struct {
		rule funnel.Rule
		at   time.Time
		w    time.Duration
	}{
		{funnel.PerDay(10, ny), at(3, 8), 23 * time.Hour},
		{funnel.PerDay(10, ny), at(11, 1), 25 * time.Hour},
		{funnel.PerDay(10, ny), at(6, 1), 24 * time.Hour},
		{funnel.PerDay(10, nil), at(3, 8), 24 * time.Hour},
		{funnel.PerMonth(10, ny), at(3, 15), 31*24*time.Hour - time.Hour},
		{funnel.PerMonth(10, nil), at(2, 15), 28 * 24 * time.Hour},
	} {
		if q, w := tc.rule.Quota(tc.at); q != 10 || w != tc.w {
			t.Errorf("%s at %v: %d per %v, want 10 per %v", tc.rule.Name, tc.at, q, w, tc.w)
		}
	}
}
