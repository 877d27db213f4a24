package outage_test

import (
	"context"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/outage"
)

// BenchmarkRun measures what a Watch adds to a call that succeeds at once:
//
//	go test -run '^$' -bench Run ./internal/outage/
func BenchmarkRun(b *testing.B) {
	ctx := context.Background()
	ok := func(context.Context) error { return nil }
	for _, tc := range []struct {
		name string
		w    *outage.Watch
	}{
		{"unwatched", nil},
		{"watched", outage.New((&fake{}).dial, time.Second)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if err := tc.w.Run(ctx, time.Second, ok); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_ = tc.w.Run(ctx, time.Second, ok)
				}
			})
		})
	}
}
