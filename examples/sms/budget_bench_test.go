package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// discard is a Provider that accepts every message and keeps none.
type discard struct{}

func (discard) Send(context.Context, string, string) error { return nil }

// benchServices returns n services on one real server, each with a client
// of its own (a fleet of n processes), with every limit but the budget out
// of the way.
func benchServices(b *testing.B, srv *testutil.Server, n int) []*Service {
	svcs := make([]*Service, n)
	for i := range svcs {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 64})
		b.Cleanup(func() { client.Close() })
		cfg := testConfig()
		cfg.TrustProxy = true
		cfg.Cooldown = time.Microsecond
		cfg.PhoneHourly, cfg.PhoneDaily = funnel.MaxWindow, funnel.MaxWindow // windows: at most MaxWindow
		cfg.IPHourly, cfg.IPDaily = 1<<24, 1<<24
		cfg.PrefixHourly, cfg.PrefixDaily, cfg.DailyBudget = 1<<24, 1<<24, 1<<28
		svc, err := NewService(client, cfg, discard{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			b.Fatal(err)
		}
		svcs[i] = svc
	}
	return svcs
}

// BenchmarkBudgetKey measures the global budget, one key for the whole
// fleet, on a real server: admissions per second through that one key, by
// n services (processes) of g goroutines each.
//
//	go test -run '^$' -bench 'BudgetKey|SendThroughBudget' -benchtime 20000x ./examples/sms/
func BenchmarkBudgetKey(b *testing.B) {
	srv := testutil.StartServer(b) // the service's keys have no test prefix: a server of its own
	for _, tc := range []struct{ services, goroutines int }{{1, 1}, {1, 16}, {1, 64}, {4, 16}} {
		b.Run(fmt.Sprintf("%d-services-x%d", tc.services, tc.goroutines), func(b *testing.B) {
			svcs := benchServices(b, srv, tc.services)
			ctx := context.Background()
			var next, denied, failed atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for _, svc := range svcs {
				for range tc.goroutines {
					wg.Go(func() {
						for next.Add(1) <= int64(b.N) {
							d, err := svc.budget.Allow(ctx, budgetKey)
							switch {
							case err != nil:
								failed.Add(1)
							case !d.Allowed:
								denied.Add(1)
							}
						}
					})
				}
			}
			wg.Wait()
			took := time.Since(start)
			b.StopTimer()
			if failed.Load() > 0 || denied.Load() > 0 {
				b.Fatalf("%d failed, %d denied of %d; want every one admitted", failed.Load(), denied.Load(), b.N)
			}
			b.ReportMetric(float64(b.N)/took.Seconds(), "admitted/s")
		})
	}
}

// BenchmarkSendThroughBudget measures whole sends (policy, lockout check,
// the four guards, the code stored) to distinct numbers from distinct
// addresses through the service's handler, all sharing the budget key.
func BenchmarkSendThroughBudget(b *testing.B) {
	srv := testutil.StartServer(b)
	for _, goroutines := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("1-service-x%d", goroutines), func(b *testing.B) {
			h := benchServices(b, srv, 1)[0].Handler()
			var next, failed atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for range goroutines {
				wg.Go(func() {
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						body := fmt.Sprintf(`{"phone":"+86138%08d"}`, i%100_000_000)
						req := httptest.NewRequest("POST", "/api/sms/send", strings.NewReader(body))
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("X-Forwarded-For", fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
						w := httptest.NewRecorder()
						h.ServeHTTP(w, req)
						if w.Code != http.StatusAccepted {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			took := time.Since(start)
			b.StopTimer()
			if failed.Load() > 0 {
				b.Fatalf("%d of %d sends not admitted", failed.Load(), b.N)
			}
			b.ReportMetric(float64(b.N)/took.Seconds(), "sends/s")
		})
	}
}
