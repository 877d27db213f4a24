package funnel_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// benchParallelism multiplies GOMAXPROCS in RunParallel: round trips, not
// CPUs, bound these calls, so many goroutines keep the server busy.
const benchParallelism = 8

// The SMS rules of the design. The peers (redis_rate, with the same
// decisions as Burst: Capacity, Rate: Leak, Period: Per) run in the bench
// program (bench/), interleaved with the funnel in one run.
var (
	benchOne   = []funnel.Rule{funnel.AtMost(5, time.Hour)}
	benchThree = []funnel.Rule{funnel.AtMost(1, time.Minute), funnel.AtMost(5, time.Hour), funnel.AtMost(10, 24*time.Hour)}
)

// benchBackend returns the real server with a client whose pool serves every
// RunParallel goroutine.
func benchBackend(b *testing.B) (*testutil.Backend, *redis.Client) {
	be := testutil.RealBackend(b)
	return be, be.ClientOpts(b, &redis.Options{PoolSize: 64})
}

// benchKeys returns n distinct keys under prefix, built before the timer.
func benchKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + "k" + strconv.Itoa(i)
	}
	return keys
}

// BenchmarkAllow measures admissions (2 round trips) on fresh keys and
// denials (1 round trip, the gate) on a flooded key; compare with
// BenchmarkPing on the same server and client, and with redis_rate in the
// bench program (bench/).
func BenchmarkAllow(b *testing.B) {
	ctx := context.Background()
	for _, rs := range []struct {
		name  string
		rules []funnel.Rule
	}{{"1rule", benchOne}, {"3rules", benchThree}} {
		// Admitted: a fresh key per call, so each call is admitted and takes
		// the lock (2 round trips).
		b.Run("admitted-serial-"+rs.name, func(b *testing.B) {
			be, c := benchBackend(b)
			lim := mustLimiter(b, c, funnel.WithPrefix(be.Prefix))
			keys := benchKeys("", b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				res, err := lim.Allow(ctx, keys[i], rs.rules...)
				if err != nil || !res.Allowed {
					b.Fatalf("Allow = %+v, %v", res, err)
				}
			}
		})
		b.Run("admitted-parallel-"+rs.name, func(b *testing.B) {
			be, c := benchBackend(b)
			lim := mustLimiter(b, c, funnel.WithPrefix(be.Prefix))
			keys := benchKeys("", b.N)
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(benchParallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := lim.Allow(ctx, keys[next.Add(1)-1], rs.rules...)
					if err != nil || !res.Allowed {
						b.Errorf("Allow = %+v, %v", res, err)
						return
					}
				}
			})
		})
		// Returning: 256 keys, each admitted again and again (the state
		// cache's gate: 1 round trip).
		b.Run("returning-serial-"+rs.name, func(b *testing.B) {
			be, c := benchBackend(b)
			lim := mustLimiter(b, c, funnel.WithPrefix(be.Prefix))
			keys := benchKeys("", 256)
			big := make([]funnel.Rule, len(rs.rules))
			for i, r := range rs.rules {
				big[i] = funnel.Rule{Name: r.Name, Capacity: 1 << 20, Leak: 1, Per: time.Hour}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				res, err := lim.Allow(ctx, keys[i%len(keys)], big...)
				if err != nil || !res.Allowed {
					b.Fatalf("Allow = %+v, %v", res, err)
				}
			}
		})
		// Denied: one flooded key; the gate denies in 1 round trip.
		b.Run("denied-parallel-"+rs.name, func(b *testing.B) {
			be, c := benchBackend(b)
			floodAndDeny(b, mustLimiter(b, c, funnel.WithPrefix(be.Prefix)), rs.rules, nil)
		})
	}
}

// BenchmarkAllowHandOff measures what a ctx that can be cancelled before
// its deadline costs on a client with ContextTimeoutEnabled: each command
// is handed to a worker goroutine (ctxcall), so that a cancellation ends the
// call at once; under a ctx that cannot end, the commands go from the
// caller's goroutine. Serial admissions of 1 rule, on fresh keys (2 round
// trips) and on returning keys (1).
func BenchmarkAllowHandOff(b *testing.B) {
	for _, fresh := range []bool{true, false} {
		for _, cancellable := range []bool{false, true} {
			name := map[bool]string{true: "admitted", false: "returning"}[fresh] + "-serial-1rule-" + map[bool]string{false: "background", true: "cancellable"}[cancellable]
			b.Run(name, func(b *testing.B) {
				be := testutil.RealBackend(b)
				c := be.ClientOpts(b, &redis.Options{PoolSize: 64, ContextTimeoutEnabled: true})
				lim := mustLimiter(b, c, funnel.WithPrefix(be.Prefix))
				ctx := context.Background()
				if cancellable {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Hour)
					defer cancel()
				}
				keys := benchKeys("", 256)
				if fresh {
					keys = benchKeys("", b.N)
				}
				big := []funnel.Rule{{Name: "big", Capacity: 1 << 20, Leak: 1, Per: time.Hour}}
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					res, err := lim.Allow(ctx, keys[i%len(keys)], big...)
					if err != nil || !res.Allowed {
						b.Fatalf("Allow = %+v, %v", res, err)
					}
				}
			})
		}
	}
}

// BenchmarkPing is the round-trip floor of the same server and client.
func BenchmarkPing(b *testing.B) {
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		_, c := benchBackend(b)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		_, c := benchBackend(b)
		b.ReportAllocs()
		b.SetParallelism(benchParallelism)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := c.Ping(ctx).Err(); err != nil {
					b.Errorf("PING: %v", err)
					return
				}
			}
		})
	})
}

// floodAndDeny fills key "flood" of lim until it denies, then measures
// parallel denials of it; before, if set, runs just before the timer starts.
func floodAndDeny(b *testing.B, lim *funnel.Limiter, rules []funnel.Rule, before func()) {
	ctx := context.Background()
	for {
		res, err := lim.Allow(ctx, "flood", rules...)
		if err != nil {
			b.Fatal(err)
		}
		if !res.Allowed {
			break
		}
	}
	if before != nil {
		before()
	}
	b.ReportAllocs()
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := lim.Allow(ctx, "flood", rules...)
			if err != nil || res.Allowed {
				b.Errorf("Allow = %+v, %v", res, err)
				return
			}
		}
	})
}
