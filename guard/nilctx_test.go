package guard_test

import (
	"context"
	"errors"
	"testing"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// TestNilContext: every call given a nil context answers ErrNilContext
// (mutex.ErrInvalid), takes and gives back nothing, runs no function, and
// is never taken for an outage (FailOpen admits nothing).
func TestNilContext(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		var nilCtx context.Context
		ctx := context.Background()
		g := newGuard(t, b, guard.WithOnError(guard.FailOpen), guard.WithInFlight(1))
		if _, err := g.Allow(ctx, "+15550001111"); err != nil {
			t.Fatal(err)
		}
		before, err := g.Peek(ctx, "+15550001111")
		if err != nil {
			t.Fatal(err)
		}
		check := func(what string, d guard.Decision, err error) {
			t.Helper()
			if !errors.Is(err, guard.ErrNilContext) || !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("%s with a nil context: %v, want ErrNilContext", what, err)
			}
			if d.Allowed {
				t.Errorf("%s with a nil context: allowed", what)
			}
		}
		d, err := g.Allow(nilCtx, "+15550001111")
		check("Allow", d, err)
		d, err = g.AllowN(nilCtx, "+15550001111", 1)
		check("AllowN", d, err)
		d, err = g.Peek(nilCtx, "+15550001111")
		check("Peek", d, err)
		check("Refund", guard.Decision{}, g.Refund(nilCtx, "+15550001111"))
		check("RefundN", guard.Decision{}, g.RefundN(nilCtx, "+15550001111", 1))
		ran := false
		d, err = g.Do(nilCtx, "+15550001111", func(context.Context) error { ran = true; return nil })
		check("Do", d, err)
		if ran {
			t.Error("Do ran its function with a nil context")
		}
		after, err := g.Peek(ctx, "+15550001111")
		if err != nil {
			t.Fatal(err)
		}
		if after.Remaining != before.Remaining {
			t.Errorf("remaining %d after the nil calls, was %d: want unchanged", after.Remaining, before.Remaining)
		}
	})
}
