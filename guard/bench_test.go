package guard_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// BenchmarkAllow measures Guard.Allow on a real server, with PING in the same
// run for the ×PING ratio:
//
//	go test -run '^$' -bench . -benchtime 3000x ./guard/
func BenchmarkAllow(b *testing.B) {
	be := testutil.RealBackend(b)
	ctx := context.Background()
	c := be.ClientOpts(b, &redis.Options{PoolSize: 64})
	roomy := []funnel.Rule{{Name: "a", Capacity: 1 << 20, Leak: 1, Per: time.Hour}}
	roomy3 := append(roomy, funnel.Rule{Name: "b", Capacity: 1 << 20, Leak: 1, Per: time.Minute}, funnel.Rule{Name: "c", Capacity: 1 << 20, Leak: 1, Per: 24 * time.Hour})
	tight := []funnel.Rule{funnel.AtMost(1, time.Hour)}
	tight3 := append(tight, funnel.AtMost(5, time.Hour), funnel.AtMost(10, 24*time.Hour))
	var seq atomic.Int64

	b.Run("ping-serial", func(b *testing.B) {
		for range b.N {
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, tc := range []struct {
		name  string
		rules []funnel.Rule
		deny  bool
	}{
		{"admitted-1rule", roomy, false},
		{"admitted-3rules", roomy3, false},
		{"denied-1rule", tight, true},
		{"denied-3rules", tight3, true},
	} {
		g, err := guard.New(c, guard.WithPrefix(be.Prefix+tc.name+":"), guard.WithRules(tc.rules...))
		if err != nil {
			b.Fatal(err)
		}
		key := func() string { return strconv.FormatInt(seq.Add(1), 36) }
		if tc.deny {
			g.Allow(ctx, "flooded")
			key = func() string { return "flooded" }
		}
		b.Run(tc.name+"-serial", func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if d, err := g.Allow(ctx, key()); err != nil || d.Allowed == tc.deny {
					b.Fatalf("%+v, %v", d, err)
				}
			}
		})
		b.Run(tc.name+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if d, err := g.Allow(ctx, key()); err != nil || d.Allowed == tc.deny {
						b.Errorf("%+v, %v", d, err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkAllowHandOff measures what a caller's ctx that can be cancelled
// costs on a client with ContextTimeoutEnabled: the guard's calls are then
// handed to a worker goroutine (internal/ctxcall), so that a cancellation
// ends them at once; under a ctx that cannot end, the guard's own Timeout
// ends them and they go from the caller's goroutine. Serial admissions of
// fresh keys, 1 rule:
//
//	go test -run '^$' -bench AllowHandOff ./guard/
func BenchmarkAllowHandOff(b *testing.B) {
	be := testutil.RealBackend(b)
	c := be.ClientOpts(b, &redis.Options{PoolSize: 64, ContextTimeoutEnabled: true})
	roomy := []funnel.Rule{{Name: "a", Capacity: 1 << 20, Leak: 1, Per: time.Hour}}
	var seq atomic.Int64
	for _, cancellable := range []bool{false, true} {
		name := map[bool]string{false: "admitted-1rule-serial-background", true: "admitted-1rule-serial-cancellable"}[cancellable]
		g, err := guard.New(c, guard.WithPrefix(be.Prefix+name+":"), guard.WithRules(roomy...))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			if cancellable {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			b.ReportAllocs()
			for range b.N {
				if d, err := g.Allow(ctx, strconv.FormatInt(seq.Add(1), 36)); err != nil || !d.Allowed {
					b.Fatalf("%+v, %v", d, err)
				}
			}
		})
	}
}

// BenchmarkDoInFlight measures Guard.Do with and without WithInFlight on
// a real server: new keys serially (a permit free at once: two more round
// trips), and 16 goroutines on one key with InFlight 4 (waits in the
// key's queue, each hand-off a release and a Pub/Sub message):
//
//	go test -run '^$' -bench DoInFlight -benchtime 2000x ./guard/
func BenchmarkDoInFlight(b *testing.B) {
	be := testutil.RealBackend(b)
	ctx := context.Background()
	c := be.ClientOpts(b, &redis.Options{PoolSize: 64})
	roomy := []funnel.Rule{{Name: "a", Capacity: 1 << 20, Leak: 1 << 20, Per: time.Second}}
	run := func(context.Context) error { return nil }
	var seq atomic.Int64
	for _, n := range []int64{0, 4} {
		g, err := guard.New(c, guard.WithPrefix(be.Prefix+strconv.FormatInt(n, 10)+":"), guard.WithRules(roomy...), guard.WithInFlight(n), guard.WithTimeout(time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		b.Run("inflight"+strconv.FormatInt(n, 10)+"-serial-newkeys", func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, err := g.Do(ctx, strconv.FormatInt(seq.Add(1), 36), run); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("inflight"+strconv.FormatInt(n, 10)+"-16goroutines-onekey", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8) // 16 on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := g.Do(ctx, "hot", run); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
