package mutex_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// BenchmarkContended measures acquisitions of one name under contention on a
// real server, and an uncontended serial Lock+Unlock cycle in the same run:
//
//	go test -run '^$' -bench Contended -benchtime 20000x ./mutex/
//
// Reported: acq/s, cmds/acq (every command the clients sent, polls included)
// and x_serial, the acquisitions per second over the serial cycle's.
func BenchmarkContended(b *testing.B) {
	be := testutil.RealBackend(b)
	ctx := context.Background()

	// The serial uncontended cycle, as the reference.
	var serialPerSec float64
	b.Run("serial-uncontended", func(b *testing.B) {
		c := be.ClientOpts(b, newOpts())
		hook := &counter{}
		c.AddHook(hook)
		l := mustNew(b, c, mutex.WithPrefix(be.Prefix))
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			lk, err := l.Lock(ctx, "serial")
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
		serialPerSec = float64(b.N) / time.Since(start).Seconds()
		report(b, b.N, time.Since(start), hook.cmds.Load(), serialPerSec)
	})

	for _, tc := range []struct {
		name              string
		lockers, routines int
	}{
		{"1-locker-x64", 1, 64},
		{"4-lockers-x16", 4, 16},
	} {
		b.Run(tc.name, func(b *testing.B) {
			hooks := make([]*counter, tc.lockers)
			lockers := make([]*mutex.Locker, tc.lockers)
			for i := range lockers {
				c := be.ClientOpts(b, newOpts())
				hooks[i] = &counter{}
				c.AddHook(hooks[i])
				lockers[i] = mustNew(b, c, mutex.WithPrefix(be.Prefix))
			}
			work := make(chan struct{}, b.N)
			for range b.N {
				work <- struct{}{}
			}
			close(work)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for i := range tc.lockers * tc.routines {
				l := lockers[i%tc.lockers]
				wg.Go(func() {
					for range work {
						lk, err := l.Lock(ctx, "hot")
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
			}
			wg.Wait()
			elapsed := time.Since(start)
			var cmds int64
			for _, h := range hooks {
				cmds += h.cmds.Load()
			}
			report(b, b.N, elapsed, cmds, serialPerSec)
		})
	}
}

func report(b *testing.B, n int, elapsed time.Duration, cmds int64, serialPerSec float64) {
	perSec := float64(n) / elapsed.Seconds()
	b.ReportMetric(perSec, "acq/s")
	b.ReportMetric(float64(cmds)/float64(n), "cmds/acq")
	if serialPerSec > 0 {
		b.ReportMetric(perSec/serialPerSec, "x_serial")
	}
}

// newOpts returns client options with a pool for 64 goroutines.
func newOpts() *redis.Options { return &redis.Options{PoolSize: 80} }
