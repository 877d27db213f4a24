package guard_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// A script cache emptied under load (SCRIPT FLUSH, or a failover to a
// replica whose cache never held the scripts) costs each call at most one
// extra round trip per script, and never an error or a degraded decision.

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

// scriptCacheRules admit at most 100 calls a day per key, and 1,000 an hour:
// nothing leaks during a test.
var scriptCacheRules = []funnel.Rule{funnel.AtMost(100, 24*time.Hour), {Name: "hourly", Capacity: 1000, Leak: 1, Per: time.Hour}}

// TestScriptCacheLossUnderLoad runs 64 goroutines of Allow on a hot key,
// through three Guards of one policy (plain, UniformCost, DenyCache), and of
// Allow, Peek and Refund on keys of their own, while another goroutine
// empties the script cache again and again. No call may fail or be
// degraded; the hot key admits exactly its daily capacity.
func TestScriptCacheLossUnderLoad(t *testing.T) {
	srv := testutil.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang, not a speed target
	defer cancel()
	stats := &testutil.ScriptStats{}
	prefix := testutil.NewPrefix()
	newGuard := func(opts ...guard.Option) *guard.Guard {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 32})
		t.Cleanup(func() { c.Close() })
		c.AddHook(stats)
		// Not DefaultTimeout: see newGuard.
		g, err := guard.New(c, append(opts, guard.WithPrefix(prefix), guard.WithRules(scriptCacheRules...), guard.WithTimeout(10*time.Second))...)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	guards := []*guard.Guard{newGuard(), newGuard(guard.WithFunnel(funnel.WithUniformCost())), newGuard(guard.WithFunnel(funnel.WithDenyCache(100)))}
	capacity := scriptCacheRules[0].Capacity

	var admitted, denied atomic.Int64
	decided := func(what string, d guard.Decision, err error) error {
		if err != nil || d.Degraded {
			return fmt.Errorf("%s = %+v, %w", what, d, err)
		}
		return nil
	}
	load := testutil.FlushLoad(t, ctx, []string{srv.Addr}, testutil.FlushWorkers, flushCalls(), flushEvery, func(ctx context.Context, w, i int) error {
		g := guards[w%len(guards)]
		if w%4 != 3 {
			d, err := g.Allow(ctx, "hot")
			if err := decided("Allow", d, err); err != nil {
				return err
			}
			if d.Allowed {
				admitted.Add(1)
			} else {
				denied.Add(1)
			}
			return nil
		}
		// A key of the worker's own: Allow takes one unit, Refund gives it
		// back, Peek sees it back.
		key := "own" + strconv.Itoa(w)
		d, err := g.Allow(ctx, key)
		if err := decided("Allow", d, err); err != nil {
			return err
		}
		if !d.Allowed || d.Remaining != capacity-1 {
			return fmt.Errorf("Allow of an empty key = %+v, want allowed with %d left", d, capacity-1)
		}
		if err := g.Refund(ctx, key); err != nil {
			return fmt.Errorf("Refund: %w", err)
		}
		d, err = g.Peek(ctx, key)
		if err := decided("Peek", d, err); err != nil {
			return err
		}
		if !d.Allowed || d.Remaining != capacity {
			return fmt.Errorf("Peek after Refund = %+v, want %d left", d, capacity)
		}
		return nil
	})
	t.Logf("%d calls, %d SCRIPT FLUSH during them; %d admitted on the hot key of capacity %d, %d denied; %v",
		load.Calls, load.Flushes, admitted.Load(), capacity, denied.Load(), stats)
	load.Check(t, testutil.MinFlushes)
	stats.Check(t, "the Guards' clients", testutil.MinFlushes)
	if got := admitted.Load(); got != capacity {
		t.Errorf("%d calls admitted on the hot key, want exactly its capacity, %d (%d denied)", got, capacity, denied.Load())
	}
}

// TestScriptCacheLossCost runs each call serially right after a SCRIPT
// FLUSH and again: right after, each script it runs costs one extra round
// trip (EVALSHA answered NOSCRIPT, then EVAL), and nothing else changes;
// made again, it costs nothing extra.
func TestScriptCacheLossCost(t *testing.T) {
	srv := testutil.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	rec := testutil.Record(c)
	flush := func(ctx context.Context) error { return testutil.ScriptFlush(ctx, srv.Addr) }
	prefix := testutil.NewPrefix()
	for _, uniform := range []bool{false, true} {
		p := []guard.Option{guard.WithPrefix(prefix), guard.WithRules(funnel.AtMost(1, time.Hour)), guard.WithTimeout(10 * time.Second)}
		if uniform {
			p = append(p, guard.WithFunnel(funnel.WithUniformCost()))
		}
		g, err := guard.New(c, p...)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(fmt.Sprintf("UniformCost=%t", uniform), func(t *testing.T) {
			cost := testutil.FlushCostOf(t, flush, func(ctx context.Context, run int) error {
				key := fmt.Sprintf("k%t/%d", uniform, run)
				// Admitted, denied, refunded, peeked: every script a guard runs.
				for i, want := range []bool{true, false} {
					d, err := g.Allow(ctx, key)
					if err != nil || d.Degraded || d.Allowed != want {
						return fmt.Errorf("Allow %d = %+v, %w; want allowed %t", i, d, err, want)
					}
				}
				if err := g.Refund(ctx, key); err != nil {
					return err
				}
				if d, err := g.Peek(ctx, key); err != nil || !d.Allowed {
					return fmt.Errorf("Peek after Refund = %+v, %w; want allowed", d, err)
				}
				return nil
			}, rec)
			t.Logf("right after SCRIPT FLUSH: %v; made again: none", cost)
		})
	}
}
