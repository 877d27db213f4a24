package funnel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// A brute force of 200 calls at one server time: the rule admits 3 and
// denies 4, the 5th denial within the minute boxes the key for 10 minutes,
// and every call after it is denied by the box, on the server's clock alone
// (miniredis's time moves only when the test moves it).
func TestPenaltyBoxBruteForce(t *testing.T) {
	b := testutil.Mini(t)
	start := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	b.Mini.SetTime(start)
	ctx := context.Background()
	rule := funnel.AtMost(3, time.Hour)
	lim := mustLimiter(t, b.Client(t), funnel.WithPrefix(b.Prefix), funnel.WithPenalty(funnel.Penalty{Denials: 5, Within: time.Minute, For: 10 * time.Minute}))
	count := map[string]int{}
	for range 200 {
		res, err := lim.Allow(ctx, "+8613800138000", rule)
		switch {
		case err != nil:
			t.Fatal(err)
		case res.Allowed:
			count["admitted"]++
		case res.Rule == funnel.PenaltyRule:
			count["box"]++
			if res.RetryAfter != 10*time.Minute || res.Remaining != 0 {
				t.Fatalf("a boxed denial = %+v, want RetryAfter 10m and nothing remaining", res)
			}
		default:
			count["rule"]++
		}
	}
	if count["admitted"] != 3 || count["rule"] != 4 || count["box"] != 193 {
		t.Fatalf("200 calls: %v; want 3 admitted, 4 denied by the rule, 193 by the box", count)
	}
	// Peek sees the box and does not count.
	if res, err := lim.Peek(ctx, "+8613800138000", rule); err != nil || res.Rule != funnel.PenaltyRule {
		t.Fatalf("Peek in the box = %+v, %v", res, err)
	}
	// One second before the box ends on the server's clock: still boxed.
	b.Mini.SetTime(start.Add(10*time.Minute - time.Second))
	if res, err := lim.Allow(ctx, "+8613800138000", rule); err != nil || res.Rule != funnel.PenaltyRule || res.RetryAfter != time.Second {
		t.Fatalf("Allow 1 s before the box ends = %+v, %v; want the box, 1s to wait", res, err)
	}
	// After the box, the rules decide again: still full (one unit leaks per
	// 20 minutes), so a denial by the rule, counted in a fresh window.
	b.Mini.SetTime(start.Add(10 * time.Minute))
	if res, err := lim.Allow(ctx, "+8613800138000", rule); err != nil || res.Allowed || res.Rule != rule.Name {
		t.Fatalf("Allow when the box ends = %+v, %v; want a denial by the rule", res, err)
	}
	// Reset forgets the box with the rest of the state.
	b.Mini.SetTime(start.Add(10*time.Minute + time.Second))
	for range 5 {
		_, _ = lim.Allow(ctx, "+8613800138000", rule)
	}
	if res, _ := lim.Allow(ctx, "+8613800138000", rule); res.Rule != funnel.PenaltyRule {
		t.Fatalf("5 more denials did not box the key again: %+v", res)
	}
	if err := lim.Reset(ctx, "+8613800138000"); err != nil {
		t.Fatal(err)
	}
	if res, err := lim.Allow(ctx, "+8613800138000", rule); err != nil || !res.Allowed {
		t.Fatalf("Allow after Reset = %+v, %v", res, err)
	}
}

// Denials spread wider than the window never box the key.
func TestPenaltyWindowRestarts(t *testing.T) {
	b := testutil.Mini(t)
	start := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	b.Mini.SetTime(start)
	ctx := context.Background()
	rule := funnel.AtMost(1, 24*time.Hour)
	lim := mustLimiter(t, b.Client(t), funnel.WithPrefix(b.Prefix), funnel.WithPenalty(funnel.Penalty{Denials: 3, Within: time.Minute, For: time.Hour}))
	if res, _ := lim.Allow(ctx, "k", rule); !res.Allowed {
		t.Fatal("first call denied")
	}
	for i := range 10 { // two denials a minute apart each time: never three in one window
		b.Mini.SetTime(start.Add(time.Duration(i) * 61 * time.Second))
		for range 2 {
			res, err := lim.Allow(ctx, "k", rule)
			if err != nil || res.Rule != rule.Name {
				t.Fatalf("denial %d = %+v, %v; want the rule's", i, res, err)
			}
		}
	}
}

// On a real server: a brute force from 8 goroutines against a rule that
// refills fast. Once the key is boxed, nothing is admitted until the box
// ends, although the rule has room again long before; then the rule admits
// again. The box's length comes from the server's clock (RetryAfter).
func TestPenaltyBoxRealServer(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	rule := funnel.Rule{Name: "fast", Capacity: 2, Leak: 1, Per: 20 * time.Millisecond}
	const box = 400 * time.Millisecond
	lim := mustLimiter(t, b.Client(t), funnel.WithPrefix(b.Prefix), funnel.WithoutBatching(), funnel.WithPenalty(funnel.Penalty{Denials: 3, Within: time.Second, For: box}))
	type call struct {
		start, end time.Time
		res        funnel.Result
	}
	var mu sync.Mutex
	var calls []call
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 25 {
				s := time.Now()
				res, err := lim.Allow(ctx, "victim", rule)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				calls = append(calls, call{s, time.Now(), res})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// The first boxed answer: its RetryAfter is the box's end, from the
	// server's clock; no call that started after it and ended before that
	// end (less a margin for the two clocks' rates) was admitted.
	var first *call
	for i := range calls {
		c := &calls[i]
		if c.res.Rule == funnel.PenaltyRule && (first == nil || c.end.Before(first.end)) {
			first = c
		}
	}
	if first == nil {
		t.Fatalf("200 calls from 8 goroutines never boxed the key: %d calls", len(calls))
	}
	if first.res.RetryAfter > box || first.res.RetryAfter <= 0 {
		t.Fatalf("first boxed answer: RetryAfter %v, want (0, %v]", first.res.RetryAfter, box)
	}
	boxEnd := first.end.Add(first.res.RetryAfter - 50*time.Millisecond)
	admitted, inBox, boxed := 0, 0, 0
	for _, c := range calls {
		switch {
		case c.res.Allowed:
			admitted++
			if c.start.After(first.end) && c.end.Before(boxEnd) {
				inBox++
			}
		case c.res.Rule == funnel.PenaltyRule:
			boxed++
		}
	}
	t.Logf("%d calls: %d admitted, %d boxed; admitted inside the box: %d", len(calls), admitted, boxed, inBox)
	if inBox != 0 {
		t.Fatalf("%d calls admitted while the key was in the box", inBox)
	}
	// Once the box has ended (server time), the rule admits again.
	time.Sleep(box)
	var res funnel.Result
	var err error
	for res, err = lim.Allow(ctx, "victim", rule); err == nil && res.Rule == funnel.PenaltyRule; res, err = lim.Allow(ctx, "victim", rule) {
		time.Sleep(res.RetryAfter)
	}
	if err != nil || !res.Allowed {
		t.Fatalf("after the box: %+v, %v; want an admission (the rule has room)", res, err)
	}
}

func TestPenaltyBadOptions(t *testing.T) {
	b := testutil.Mini(t)
	for _, p := range []funnel.Penalty{
		{Denials: 0, Within: time.Minute, For: time.Minute},
		{Denials: 3, Within: 0, For: time.Minute},
		{Denials: 3, Within: time.Minute, For: time.Microsecond},
		{Denials: 3, Within: time.Minute, For: 400 * 24 * time.Hour},
		{Denials: -1, Within: -time.Minute, For: -time.Minute},
	} {
		if lim, err := funnel.New(b.Client(t), funnel.WithPenalty(p)); !errors.Is(err, funnel.ErrInvalidOption) || lim != nil {
			t.Errorf("WithPenalty(%+v): New = %v, %v; want nil, ErrInvalidOption", p, lim, err)
		}
	}
}

// With a penalty box, Allow and Peek return by their deadline on a hung
// server, on clients that honour deadlines and on ones that do not.
func TestPenaltyHungServer(t *testing.T) {
	srv := testutil.StartServer(t)
	rule := funnel.AtMost(1, time.Hour)
	for _, honours := range []bool{true, false} {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: honours})
		defer c.Close()
		lim := mustLimiter(t, c, funnel.WithPenalty(funnel.Penalty{Denials: 3, Within: time.Minute, For: time.Minute}))
		if _, err := lim.Allow(context.Background(), "warm", rule); err != nil { // scripts loaded, a connection open
			t.Fatal(err)
		}
		thaw := testutil.Freeze(t, srv.Pid())
		for name, call := range map[string]func(context.Context) error{
			"Allow": func(ctx context.Context) error { _, err := lim.Allow(ctx, "k", rule); return err },
			"Peek":  func(ctx context.Context) error { _, err := lim.Peek(ctx, "k", rule); return err },
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			start := time.Now()
			err := call(ctx)
			took := time.Since(start)
			cancel()
			// A bound against a hang, with room for a loaded machine.
			if err == nil || took > 300*time.Millisecond+time.Second {
				t.Errorf("%s on a hung server (ContextTimeoutEnabled %v): %v after %v; want an error by the deadline", name, honours, err, took)
			}
			t.Logf("%s on a hung server (ContextTimeoutEnabled %v): %v", name, honours, took.Round(100*time.Microsecond))
		}
		thaw()
	}
}
