package funnel_test

import (
	"context"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// step is one call of a table test: at offset at from the start, n units;
// want the decision, and (when denied) the wait.
type step struct {
	at      time.Duration
	n       int64
	allowed bool
	retry   time.Duration
}

// run plays steps against lim on miniredis, whose clock the steps set.
func run(t *testing.T, b *testutil.Backend, lim *funnel.Limiter, key string, steps []step, rules ...funnel.Rule) {
	t.Helper()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, s := range steps {
		b.Mini.SetTime(t0.Add(s.at))
		res, err := lim.AllowN(context.Background(), key, s.n, rules...)
		if err != nil {
			t.Fatalf("step %d (%v, n=%d): %v", i, s.at, s.n, err)
		}
		if res.Allowed != s.allowed || (!s.allowed && res.RetryAfter != s.retry) {
			t.Fatalf("step %d (%v, n=%d): allowed %v retry %v, want %v %v (%+v)", i, s.at, s.n, res.Allowed, res.RetryAfter, s.allowed, s.retry, res)
		}
	}
}

func TestCooldownAtExactlySixtySeconds(t *testing.T) {
	b := testutil.Mini(t)
	lim := newLimiter(t, b)
	run(t, b, lim, "+8613800138000", []step{
		{0, 1, true, 0},
		{time.Second, 1, false, 59 * time.Second},
		{60*time.Second - time.Microsecond, 1, false, time.Microsecond},
		{60 * time.Second, 1, true, 0},
		{60 * time.Second, 1, false, 60 * time.Second},
	}, funnel.AtMost(1, time.Minute))
}

func TestBurstThenLeak(t *testing.T) {
	b := testutil.Mini(t)
	lim := newLimiter(t, b)
	rule := funnel.Rule{Name: "hour", Capacity: 3, Leak: 2, Per: time.Hour} // one unit every 30 min
	run(t, b, lim, "k", []step{
		{0, 1, true, 0},
		{0, 2, true, 0},
		{0, 1, false, 30 * time.Minute},
		{10 * time.Minute, 1, false, 20 * time.Minute},
		{30 * time.Minute, 1, true, 0},
		{30 * time.Minute, 1, false, 30 * time.Minute},
		{90 * time.Minute, 2, true, 0}, // 2 leaked
		{90 * time.Minute, 2, false, time.Hour},
	}, rule)
}

func TestDeniedCallTakesNothing(t *testing.T) {
	// A call denied by the daily rule takes nothing from the cooldown rule.
	b := testutil.Mini(t)
	lim := newLimiter(t, b)
	rules := []funnel.Rule{funnel.AtMost(1, time.Minute), funnel.AtMost(2, 24*time.Hour)}
	run(t, b, lim, "k", []step{
		{0, 1, true, 0},
		{time.Minute, 1, true, 0},
		{2 * time.Minute, 1, false, 24*time.Hour - 2*time.Minute},
		// The denial above took nothing from the cooldown: only the daily
		// rule decides the next call.
		{24 * time.Hour, 1, true, 0},
	}, rules...)
}

func TestResultFields(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		lim := newLimiter(t, b)
		rules := []funnel.Rule{
			{Name: "burst", Capacity: 5, Leak: 1, Per: time.Second},
			{Name: "day", Capacity: 3, Leak: 3, Per: 24 * time.Hour},
		}
		res, err := lim.AllowN(ctx, "k", 2, rules...)
		if err != nil || !res.Allowed || res.Remaining != 1 || res.Rule != "" || res.RetryAfter != 0 {
			t.Fatalf("first = %+v, %v; want allowed, remaining 1 (day)", res, err)
		}
		if res.ResetAfter < 16*time.Hour-time.Second || res.ResetAfter > 16*time.Hour {
			t.Fatalf("ResetAfter = %v, want 16h (2 units of a 3/day funnel)", res.ResetAfter)
		}
		res, err = lim.AllowN(ctx, "k", 2, rules...)
		if err != nil || res.Allowed || res.Rule != "day" || res.RetryAfter < 7*time.Hour || res.RetryAfter > 8*time.Hour {
			t.Fatalf("second = %+v, %v; want denied by day for ~8h", res, err)
		}
		peek, err := lim.Peek(ctx, "k", rules...)
		if err != nil || !peek.Allowed || peek.Remaining != 1 {
			t.Fatalf("Peek = %+v, %v; want allowed with 1 remaining", peek, err)
		}
		if err := lim.Refund(ctx, "k", 2, rules...); err != nil {
			t.Fatal(err)
		}
		if res, err := lim.AllowN(ctx, "k", 3, rules...); err != nil || !res.Allowed {
			t.Fatalf("after Refund(2) AllowN(3) = %+v, %v", res, err)
		}
		if err := lim.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if n := b.Client(t).Exists(ctx, b.Prefix+"{k}:f").Val(); n != 0 {
			t.Fatal("state key left after Reset")
		}
	})
}

// A server clock that steps back (a failover to a lagging server) credits
// no leak twice, and RetryAfter counts the lag.
func TestClockStepsBack(t *testing.T) {
	b := testutil.Mini(t)
	lim := newLimiter(t, b)
	run(t, b, lim, "k", []step{
		{0, 1, true, 0},
		{-10 * time.Second, 1, false, 70 * time.Second},
		{50 * time.Second, 1, false, 10 * time.Second},
		{60 * time.Second, 1, true, 0},
	}, funnel.AtMost(1, time.Minute))
}

// Behind a stepped-back clock a funnel with room still admits: the gate
// that denies without the lock must not take the stored time for "full".
func TestClockStepsBackWithRoom(t *testing.T) {
	b := testutil.Mini(t)
	lim := newLimiter(t, b)
	run(t, b, lim, "k", []step{
		{0, 1, true, 0},
		{-10 * time.Second, 1, true, 0},
		{-10 * time.Second, 1, false, 70 * time.Second},
	}, funnel.Rule{Name: "r", Capacity: 2, Leak: 1, Per: time.Minute})
}
