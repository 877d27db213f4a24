package guard_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

var smsRules = []funnel.Rule{
	{Name: "cooldown", Capacity: 1, Leak: 1, Per: time.Minute},
	funnel.AtMost(5, time.Hour),
	funnel.AtMost(10, 24*time.Hour),
}

// newGuard returns a guard on b with opts, after defaults of its own: the
// prefix b.Prefix + "g:" (a test that sets one starts it with b.Prefix),
// smsRules, and a Timeout of 10 s.
func newGuard(t *testing.T, b *testutil.Backend, opts ...guard.Option) *guard.Guard {
	t.Helper()
	// DefaultTimeout (500 ms) is a product setting: a test that passed
	// only when each call returned within it would test the machine.
	defaults := []guard.Option{guard.WithPrefix(b.Prefix + "g:"), guard.WithRules(smsRules...), guard.WithTimeout(10 * time.Second)}
	g, err := guard.New(b.Client(t), append(defaults, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestDecisions(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		g := newGuard(t, b)
		d, err := g.Allow(ctx, "+8613800138000")
		if err != nil || !d.Allowed || d.Degraded {
			t.Fatalf("first = %+v, %v", d, err)
		}
		d, err = g.Allow(ctx, "+8613800138000")
		if err != nil || d.Allowed || d.Rule != "cooldown" || d.RetryAfter <= 50*time.Second || d.RetryAfter > time.Minute {
			t.Fatalf("second = %+v, %v; want denied by cooldown for ~60s", d, err)
		}
		if d, _ := g.Allow(ctx, "+8613800138001"); !d.Allowed {
			t.Fatal("another number was denied")
		}
	})
}

// Three rules denied by the third consume nothing from the first two.
func TestAllOrNothing(t *testing.T) {
	b := testutil.Mini(t)
	ctx := context.Background()
	g := newGuard(t, b,
		guard.WithRules(funnel.AtMost(3, time.Minute), funnel.AtMost(3, time.Hour), funnel.AtMost(1, 24*time.Hour)),
	)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b.Mini.SetTime(t0)
	if d, _ := g.Allow(ctx, "k"); !d.Allowed {
		t.Fatal("first call denied")
	}
	for i := range 5 {
		d, err := g.Allow(ctx, "k")
		if err != nil || d.Allowed || d.Rule != "1/24h0m0s" {
			t.Fatalf("call %d = %+v, %v; want denied by the daily rule", i, d, err)
		}
	}
	// Had the denials taken units, the minute and hour rules would be full.
	b.Mini.SetTime(t0.Add(24 * time.Hour))
	d, err := g.AllowN(ctx, "k", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("after a day = %+v, %v", d, err)
	}
	if d.Remaining != 0 || d.Tightest != "1/24h0m0s" {
		t.Fatalf("remaining %d of %q; want 0 of the daily rule", d.Remaining, d.Tightest)
	}
}

func TestRefundAndDo(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		g := newGuard(t, b)
		if d, _ := g.Allow(ctx, "p"); !d.Allowed {
			t.Fatal("denied")
		}
		if err := g.Refund(ctx, "p"); err != nil {
			t.Fatal(err)
		}
		if d, _ := g.Allow(ctx, "p"); !d.Allowed {
			t.Fatal("Refund did not give the unit back")
		}

		sendErr := errors.New("provider refused")
		ran := 0
		d, err := g.Do(ctx, "q", func(context.Context) error { ran++; return sendErr })
		if !d.Allowed || !errors.Is(err, sendErr) || ran != 1 {
			t.Fatalf("Do with a failing send = %+v, %v, ran %d", d, err, ran)
		}
		d, err = g.Do(ctx, "q", func(context.Context) error { ran++; return nil })
		if !d.Allowed || err != nil || ran != 2 {
			t.Fatalf("Do after the refund = %+v, %v; the failed send should have been refunded", d, err)
		}
		d, err = g.Do(ctx, "q", func(context.Context) error { ran++; return nil })
		if d.Allowed || err != nil || ran != 2 {
			t.Fatalf("denied Do = %+v, %v, ran %d; fn must not run", d, err, ran)
		}
	})
}

func TestFailClosedAndOpen(t *testing.T) {
	ctx := context.Background()
	b := testutil.Mini(t)
	closed := newGuard(t, b)
	open := newGuard(t, b, guard.WithOnError(guard.FailOpen), guard.WithPrefix(b.Prefix+"open:"))
	b.Mini.SetError("LOADING Redis is loading the dataset in memory")
	d, err := closed.Allow(ctx, "k")
	if d.Allowed || !d.Degraded || d.RetryAfter != guard.DefaultErrorRetry || !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("fail closed = %+v, %v", d, err)
	}
	d, err = open.Allow(ctx, "k")
	if !d.Allowed || !d.Degraded || !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("fail open = %+v, %v", d, err)
	}
	b.Mini.SetError("")
	if d, err := closed.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("after recovery = %+v, %v", d, err)
	}
}

func TestStoppedServerFailsClosed(t *testing.T) {
	srv := testutil.StartServer(t)
	g, err := guard.New(srv.Client(t), guard.WithRules(smsRules...), guard.WithTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if d, err := g.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("before the stop = %+v, %v", d, err)
	}
	srv.Kill()
	for i := range 5 {
		d, err := g.Allow(ctx, "k"+string(rune('a'+i)))
		if d.Allowed || !errors.Is(err, guard.ErrUnavailable) {
			t.Fatalf("call %d with the server down = %+v, %v; want a denial", i, d, err)
		}
	}
}

// A Redis that does not answer costs WithTimeout: Allow returns, denied
// with ErrUnavailable, while every command it sent is still held unanswered,
// and by its Timeout plus a margin for a loaded machine (a second; without
// the Timeout it would wait as long as Redis does, here for ever).
func TestSlowRedisBoundedByTimeout(t *testing.T) {
	b := testutil.Mini(t)
	c := b.Client(t)
	hold, release := testutil.HoldHook()
	defer release() // lets the commands still held go, so that none outlives the test
	c.AddHook(hold)
	const timeout = 50 * time.Millisecond
	g, err := guard.New(c, guard.WithPrefix(b.Prefix), guard.WithRules(smsRules...), guard.WithTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		d   guard.Decision
		err error
		el  time.Duration
	}
	got := make(chan result, 1)
	go func() {
		start := time.Now()
		d, err := g.Allow(context.Background(), "k")
		got <- result{d, err, time.Since(start)}
	}()
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatalf("Allow with a %v Timeout still waiting for Redis after 10 s: not bounded", timeout)
	}
	if r.d.Allowed || !errors.Is(r.err, guard.ErrUnavailable) {
		t.Fatalf("Redis that does not answer = %+v, %v", r.d, r.err)
	}
	if r.el > timeout+time.Second {
		t.Fatalf("Allow took %v with a %v Timeout: not bounded by it", r.el, timeout)
	}
}

func TestFallbackWhileDown(t *testing.T) {
	b := testutil.Mini(t)
	g := newGuard(t, b, guard.WithFallback(guard.Fallback{Limit: 0.001, Burst: 2}))
	b.Mini.SetError("MASTERDOWN Link with MASTER is down")
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		d, err := g.Allow(ctx, "k")
		if d.Allowed != want || !d.Degraded || !errors.Is(err, guard.ErrUnavailable) {
			t.Fatalf("fallback call %d = %+v, %v; want allowed %v", i, d, err, want)
		}
		if !want && d.RetryAfter <= 0 {
			t.Fatal("fallback denial without RetryAfter")
		}
	}
}

func TestObserver(t *testing.T) {
	b := testutil.Mini(t)
	var got []guard.Observation
	g := newGuard(t, b, guard.WithObserve(func(o guard.Observation) { got = append(got, o) }))
	g.Allow(context.Background(), "secret-phone")
	g.Allow(context.Background(), "secret-phone")
	if len(got) != 2 || !got[0].Decision.Allowed || got[1].Decision.Allowed || got[0].Latency <= 0 {
		t.Fatalf("observations %+v", got)
	}
	if strings.Contains(got[0].Prefix, "secret-phone") {
		t.Fatal("the observation carries the key")
	}
}

func TestBadOptions(t *testing.T) {
	c := testutil.Mini(t).Client(t)
	for name, p := range map[string][]guard.Option{
		"no rules":       {},
		"bad rule":       {guard.WithRules(funnel.Rule{Name: "x", Capacity: 0, Leak: 1, Per: time.Second})},
		"duplicate rule": {guard.WithRules(funnel.AtMost(1, time.Second), funnel.AtMost(1, time.Second))},
		"brace prefix":   {guard.WithPrefix("a{"), guard.WithRules(smsRules...)},
		"bad mode":       {guard.WithRules(smsRules...), guard.WithOnError(7)},
		"bad fallback":   {guard.WithRules(smsRules...), guard.WithFallback(guard.Fallback{})},
		"a nil Option":   {guard.WithRules(smsRules...), nil},
	} {
		if _, err := guard.New(c, p...); !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("%s: New = %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := guard.New(c, guard.WithRules(funnel.Rule{Name: "x", Leak: 1, Per: time.Second})); !errors.Is(err, funnel.ErrInvalidRule) {
		t.Errorf("bad rule error does not carry funnel.ErrInvalidRule: %v", err)
	}
	if _, err := guard.New(nil, guard.WithRules(smsRules...)); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("nil client: %v", err)
	}
}

// Options apply in order: a later one replaces what an earlier one set
// (the rules, the prefix), but WithFunnel's options add up.
func TestOptionsInOrder(t *testing.T) {
	b := testutil.Mini(t)
	ctx := context.Background()
	g := newGuard(t, b, guard.WithRules(funnel.AtMost(5, time.Hour)), guard.WithRules(funnel.AtMost(1, time.Hour)),
		guard.WithPrefix(b.Prefix+"x:"), guard.WithPrefix(b.Prefix+"y:"))
	if d, err := g.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("first Allow = %+v, %v", d, err)
	}
	if d, _ := g.Allow(ctx, "k"); d.Allowed {
		t.Fatal("second Allow admitted: the first WithRules decided, not the last")
	}
	for _, k := range b.Mini.Keys() {
		if !strings.HasPrefix(k, b.Prefix+"y:") {
			t.Errorf("key %q outside the last WithPrefix", k)
		}
	}
	_, err := guard.New(b.Client(t), guard.WithRules(smsRules...), guard.WithFunnel(funnel.WithUniformCost()), guard.WithFunnel(funnel.WithDenyCache(0)))
	if !errors.Is(err, funnel.ErrInvalidOption) {
		t.Errorf("New with a bad option in a second WithFunnel = %v; want funnel.ErrInvalidOption", err)
	}
}

func TestPeekTakesNothing(t *testing.T) {
	b := testutil.Mini(t)
	ctx := context.Background()
	g := newGuard(t, b)
	for range 3 {
		if d, err := g.Peek(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("Peek = %+v, %v", d, err)
		}
	}
	if d, _ := g.Allow(ctx, "k"); !d.Allowed {
		t.Fatal("Peek took a unit")
	}
	if d, err := g.Peek(ctx, "k"); err != nil || d.Allowed || d.RetryAfter <= 50*time.Second {
		t.Fatalf("Peek after the send = %+v, %v; want the cooldown's wait", d, err)
	}
}
