package ctxcall_test

import (
	"context"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
)

// BenchmarkDo is the hand-off's own cost: a call under a context that can
// end, handed to a worker and back, with nothing to send.
func BenchmarkDo(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	w := ctxcall.NewWorkers()
	f := func(context.Context) (any, error) { return nil, nil }
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ctxcall.Do(ctx, w, f, nil); err != nil {
			b.Fatal(err)
		}
	}
}
