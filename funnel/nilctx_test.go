package funnel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// TestNilContext: every call given a nil context answers ErrNilContext
// (mutex.ErrInvalid) and takes, gives back and resets nothing.
func TestNilContext(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		var nilCtx context.Context
		ctx := context.Background()
		lim := newLimiter(t, b)
		rule := funnel.AtMost(3, time.Hour)
		if _, err := lim.AllowN(ctx, "k", 2, rule); err != nil {
			t.Fatal(err)
		}
		check := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, funnel.ErrNilContext) || !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("%s with a nil context: %v, want ErrNilContext", what, err)
			}
		}
		_, err := lim.Allow(nilCtx, "k", rule)
		check("Allow", err)
		_, err = lim.AllowN(nilCtx, "k", 1, rule)
		check("AllowN", err)
		_, err = lim.Peek(nilCtx, "k", rule)
		check("Peek", err)
		check("Refund", lim.Refund(nilCtx, "k", 1, rule))
		check("Reset", lim.Reset(nilCtx, "k"))
		res, err := lim.Peek(ctx, "k", rule)
		if err != nil {
			t.Fatal(err)
		}
		if res.Remaining != 1 {
			t.Errorf("remaining after the nil calls: %d, want 1 (2 of 3 taken, nothing more, nothing given back)", res.Remaining)
		}
	})
}
