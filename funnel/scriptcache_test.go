package funnel_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// A script cache emptied under load (SCRIPT FLUSH, or a failover to a
// replica whose cache never held the scripts) costs each call at most one
// extra round trip per script, and never an error.

// The load of the script cache tests: 64 goroutines, the script cache
// flushed every flushEvery calls completed in all.
const flushEvery = 16

// flushCalls is each worker's number of calls: 64 x 16 calls and a flush
// every 16 make 64 flushes; -short keeps the 20 the test needs.
func flushCalls() int {
	if testing.Short() {
		return 6
	}
	return 16
}

// TestScriptCacheLossUnderLoad runs 64 goroutines of Allow (batched and
// not), AllowN, Peek, Refund and Reset while another goroutine empties the
// script cache again and again. No call may fail; the hot key, whose rule
// leaks one unit a day, admits no more than its capacity, and exactly its
// capacity once a call of one unit was denied; each worker's own key gives
// the same answers as it would without flushes.
func TestScriptCacheLossUnderLoad(t *testing.T) {
	srv := testutil.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang, not a speed target
	defer cancel()
	stats := &testutil.ScriptStats{}
	prefix := testutil.NewPrefix()
	limiter := func(opts ...funnel.Option) *funnel.Limiter {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 32})
		t.Cleanup(func() { c.Close() })
		c.AddHook(stats)
		return mustLimiter(t, c, append([]funnel.Option{funnel.WithPrefix(prefix)}, opts...)...)
	}
	batched := []*funnel.Limiter{limiter(), limiter()}
	alone := []*funnel.Limiter{limiter(funnel.WithoutBatching()), limiter(funnel.WithoutBatching())}
	hot := funnel.Rule{Name: "hot", Capacity: 150, Leak: 1, Per: 24 * time.Hour}
	own := funnel.Rule{Name: "own", Capacity: 3, Leak: 1, Per: 24 * time.Hour}

	var units, denied1 atomic.Int64 // units admitted on the hot key; calls of one unit denied
	allowHot := func(ctx context.Context, lim *funnel.Limiter, n int64) error {
		res, err := lim.AllowN(ctx, "hot", n, hot)
		if err != nil {
			return fmt.Errorf("AllowN(%d): %w", n, err)
		}
		switch {
		case res.Allowed:
			units.Add(n)
		case n == 1:
			denied1.Add(1)
		}
		return nil
	}
	// ownKey runs the same steps on a key of the worker's own, each with a
	// known answer.
	ownKey := func(ctx context.Context, lim *funnel.Limiter, key string) error {
		if err := lim.Reset(ctx, key); err != nil {
			return fmt.Errorf("Reset: %w", err)
		}
		steps := []struct {
			what string
			n    int64 // AllowN's n, or 0 for Peek
			want bool
			left int64
		}{{"AllowN(2)", 2, true, 1}, {"Peek", 0, true, 1}, {"Allow", 1, true, 0}, {"Allow of a full key", 1, false, 0}}
		for _, s := range steps {
			var res funnel.Result
			var err error
			if s.n == 0 {
				res, err = lim.Peek(ctx, key, own)
			} else {
				res, err = lim.AllowN(ctx, key, s.n, own)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s.what, err)
			}
			if res.Allowed != s.want || res.Remaining != s.left {
				return fmt.Errorf("%s = %+v, want allowed %t with %d left", s.what, res, s.want, s.left)
			}
		}
		if err := lim.Refund(ctx, key, 2, own); err != nil {
			return fmt.Errorf("Refund: %w", err)
		}
		if res, err := lim.Peek(ctx, key, own); err != nil || res.Remaining != 2 {
			return fmt.Errorf("Peek after Refund(2) = %+v, %w; want 2 left", res, err)
		}
		return nil
	}

	load := testutil.FlushLoad(t, ctx, []string{srv.Addr}, testutil.FlushWorkers, flushCalls(), flushEvery, func(ctx context.Context, w, i int) error {
		switch w % 4 {
		case 0:
			return allowHot(ctx, batched[w/4%2], 1)
		case 1:
			return allowHot(ctx, alone[w/4%2], 1)
		case 2:
			return allowHot(ctx, batched[w/4%2], 2)
		}
		lims := batched
		if i%2 == 1 {
			lims = alone
		}
		return ownKey(ctx, lims[w/4%2], "own"+strconv.Itoa(w))
	})
	peek, err := batched[0].Peek(ctx, "hot", hot)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d calls, %d SCRIPT FLUSH during them; %d units admitted on the hot key of capacity %d (%d calls of one unit denied); %v",
		load.Calls, load.Flushes, units.Load(), hot.Capacity, denied1.Load(), stats)
	load.Check(t, testutil.MinFlushes)
	stats.Check(t, "the Limiters' clients", testutil.MinFlushes)
	if got := units.Load(); got > hot.Capacity {
		t.Errorf("%d units admitted on the hot key, capacity %d: over-admission of %d", got, hot.Capacity, got-hot.Capacity)
	} else if denied1.Load() > 0 && got != hot.Capacity {
		t.Errorf("%d units admitted on the hot key of capacity %d, yet a call of one unit was denied", got, hot.Capacity)
	}
	if peek.Remaining != hot.Capacity-units.Load() {
		t.Errorf("Peek of the hot key: %d left, want %d (capacity %d less %d admitted)", peek.Remaining, hot.Capacity-units.Load(), hot.Capacity, units.Load())
	}
}

// TestScriptCacheLossCost runs each call serially right after a SCRIPT
// FLUSH and again: right after, each script it runs costs one extra round
// trip (EVALSHA answered NOSCRIPT, then EVAL), and nothing else changes;
// made again, it costs nothing extra.
func TestScriptCacheLossCost(t *testing.T) {
	srv := testutil.StartServer(t)
	prefix := testutil.NewPrefix()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	rec := testutil.Record(c)
	lim := mustLimiter(t, c, funnel.WithPrefix(prefix))
	alone := mustLimiter(t, c, funnel.WithPrefix(prefix), funnel.WithoutBatching())
	uniform := mustLimiter(t, c, funnel.WithPrefix(prefix), funnel.WithUniformCost())
	flush := func(ctx context.Context) error { return testutil.ScriptFlush(ctx, srv.Addr) }
	rule := funnel.Rule{Name: "two", Capacity: 2, Leak: 1, Per: 24 * time.Hour}
	// allow3 makes three calls of one unit on a key with no state: admitted
	// in the read's script, then under the lock, then denied by the read.
	allow3 := func(lim *funnel.Limiter) func(ctx context.Context, key string) error {
		return func(ctx context.Context, key string) error {
			for i, want := range []bool{true, true, false} {
				res, err := lim.Allow(ctx, key, rule)
				if err != nil {
					return err
				}
				if res.Allowed != want {
					return fmt.Errorf("call %d = %+v, want allowed %t", i, res, want)
				}
			}
			return nil
		}
	}
	for _, tc := range []struct {
		name string
		op   func(ctx context.Context, key string) error
	}{
		{"Allow", allow3(lim)},
		{"Allow WithoutBatching", allow3(alone)},
		{"Allow WithUniformCost", allow3(uniform)},
		{"AllowN, Peek", func(ctx context.Context, key string) error {
			if res, err := lim.AllowN(ctx, key, 2, rule); err != nil || !res.Allowed {
				return fmt.Errorf("AllowN(2) = %+v, %w", res, err)
			}
			res, err := lim.Peek(ctx, key, rule)
			if err != nil || res.Allowed || res.Remaining != 0 {
				return fmt.Errorf("Peek = %+v, %w; want a full key", res, err)
			}
			return nil
		}},
		{"Refund", func(ctx context.Context, key string) error {
			if res, err := lim.AllowN(ctx, key, 2, rule); err != nil || !res.Allowed {
				return fmt.Errorf("AllowN(2) = %+v, %w", res, err)
			}
			return lim.Refund(ctx, key, 1, rule)
		}},
		{"Reset", func(ctx context.Context, key string) error {
			if res, err := lim.Allow(ctx, key, rule); err != nil || !res.Allowed {
				return fmt.Errorf("Allow = %+v, %w", res, err)
			}
			return lim.Reset(ctx, key)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cost := testutil.FlushCostOf(t, flush, func(ctx context.Context, run int) error {
				return tc.op(ctx, fmt.Sprintf("%s/%d", tc.name, run))
			}, rec)
			t.Logf("right after SCRIPT FLUSH: %v; made again: none", cost)
		})
	}
}
