package funnel_test

import (
	"context"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// A key with no state is admitted in one round trip under any rule but a
// calendar's; the returning key's one-round-trip admission is a funnel's
// alone: under a Window a returning key's admission takes two round trips
// (its denial one, the window's gate), and under a rule that shares its
// state (Sharing: guard's plans), which keeps no gate, its admission and
// its denial take two. The README and the package documentation give
// these counts.
func TestWindowAndSharedRoundTrips(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		for _, c := range []struct {
			name  string
			rule  funnel.Rule
			trips []int64 // admitted, admitted, denied, denied
		}{
			{"window", funnel.Window(2, time.Hour), []int64{1, 2, 1, 1}},
			{"shared", funnel.AtMost(2, time.Hour).Sharing("plan rule 0"), []int64{1, 2, 2, 2}},
			{"shared window", funnel.Window(2, time.Hour).Sharing("plan rule 0"), []int64{1, 2, 2, 2}},
		} {
			lim, counter := countingLimiter(t, b)
			for range 3 { // admitted, admitted, denied: every script loaded
				if _, err := lim.Allow(ctx, "warm-up "+c.name, c.rule); err != nil {
					t.Fatal(err)
				}
			}
			for i, want := range c.trips {
				counter.N.Store(0)
				res, err := lim.Allow(ctx, "k "+c.name, c.rule)
				if err != nil || res.Allowed != (i < 2) {
					t.Fatalf("%s, call %d: %+v, %v; want allowed %v", c.name, i, res, err, i < 2)
				}
				if n := counter.N.Load(); n != want {
					t.Errorf("%s, call %d (allowed %v): %d commands; want %d", c.name, i, res.Allowed, n, want)
				}
			}
		}
	})
}
