package mutex_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// benchNames is how many names one goroutine cycles through: each lock is
// released before its name comes round again, so a goroutine never waits on
// itself, and the names are built before the timer starts.
const benchNames = 1024

// benchLockNames returns benchNames lock names of one goroutine.
func benchLockNames(g int64) []string {
	ns := make([]string, benchNames)
	for i := range ns {
		ns[i] = "bench:" + strconv.FormatInt(g, 10) + ":" + strconv.Itoa(i)
	}
	return ns
}

// serialCycles is b's loop of Lock and Unlock through l, one goroutine,
// on names in turn, under ctx.
func serialCycles(b *testing.B, ctx context.Context, l *mutex.Locker, names []string) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		lk, err := l.Lock(ctx, names[i%len(names)])
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLockUnlock measures an uncontended Lock and Unlock (two round
// trips); compare with BenchmarkPing, one round trip on the same server.
func BenchmarkLockUnlock(b *testing.B) {
	be := testutil.RealBackend(b)
	l := mustNew(b, be.Client(b), mutex.WithPrefix(be.Prefix))
	ctx := context.Background()

	b.Run("serial", func(b *testing.B) { serialCycles(b, ctx, l, benchLockNames(0)) })

	// A client with ContextTimeoutEnabled. Under a ctx that cannot end,
	// every command goes from the caller's goroutine; under one that can be
	// cancelled before its deadline, Lock hands its command to a worker
	// goroutine (ctxcall) so that a cancellation ends it at once, and Unlock,
	// detached from the cancellation, sends its own: the difference is the
	// hand-off's cost.
	timed := mustNew(b, be.ClientOpts(b, &redis.Options{ContextTimeoutEnabled: true}), mutex.WithPrefix(be.Prefix))
	b.Run("serial-ctxtimeout", func(b *testing.B) { serialCycles(b, ctx, timed, benchLockNames(0)) })
	b.Run("serial-ctxtimeout-cancellable", func(b *testing.B) {
		cctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		serialCycles(b, cctx, timed, benchLockNames(0))
	})

	b.Run("parallel", func(b *testing.B) {
		var next atomic.Int64 // goroutine ids; names of distinct goroutines never collide
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ns := benchLockNames(next.Add(1))
			for i := 0; pb.Next(); i++ {
				lk, err := l.Lock(ctx, ns[i%benchNames])
				if err != nil {
					b.Error(err)
					return
				}
				if err := lk.Unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkPing is the round-trip floor of the same server and client set-up.
func BenchmarkPing(b *testing.B) {
	be := testutil.RealBackend(b)
	c := be.Client(b)
	ctx := context.Background()

	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := c.Ping(ctx).Err(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
