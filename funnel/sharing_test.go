package funnel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// Rules that share a state (Sharing) decide a key on what the others took:
// a key moved from a large window or funnel to a small one is denied at
// once, and moved back it has what is left of the large one; without
// Sharing the small rule starts empty.
func TestSharingKeepsUsage(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		lim := mustLimiter(t, b.Client(t), funnel.WithPrefix(b.Prefix))
		for _, tc := range []struct {
			name       string
			big, small funnel.Rule
		}{
			{"window", funnel.Window(1000, time.Minute), funnel.Window(10, time.Minute)},
			{"funnel", funnel.Rule{Name: "pro", Capacity: 1000, Leak: 1000, Per: time.Minute},
				funnel.Rule{Name: "free", Capacity: 10, Leak: 10, Per: time.Minute}},
			{"day", funnel.PerDay(1000, time.UTC), funnel.PerDay(10, time.UTC)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				big, small := tc.big.Sharing("plan"), tc.small.Sharing("plan")
				key := "tenant-" + tc.name
				if res, err := lim.AllowN(ctx, key, 500, big); err != nil || !res.Allowed {
					t.Fatalf("500 on the large rule: %+v, %v", res, err)
				}
				res, err := lim.Allow(ctx, key, small)
				if err != nil || res.Allowed || res.Rule != tc.small.Name || res.RetryAfter <= 0 {
					t.Fatalf("on the small rule after 500 on the large: %+v, %v; want a denial by %q", res, err, tc.small.Name)
				}
				// 500 left (a few more if the funnel drained meanwhile: one a 60 ms).
				if res, err := lim.Peek(ctx, key, big); err != nil || !res.Allowed || res.Remaining < 500 || res.Remaining > 520 {
					t.Fatalf("back on the large rule: %+v, %v; want 500 left", res, err)
				}
				// Moved up: a key that filled the small rule is admitted by
				// the large one at once (no gate of the small one's stands).
				up := key + "-up"
				if res, err := lim.AllowN(ctx, up, 10, small); err != nil || !res.Allowed {
					t.Fatalf("10 on the small rule: %+v, %v", res, err)
				}
				if res, err := lim.Allow(ctx, up, small); err != nil || res.Allowed {
					t.Fatalf("the 11th on the small rule: %+v, %v; want a denial", res, err)
				}
				if res, err := lim.Allow(ctx, up, big); err != nil || !res.Allowed {
					t.Fatalf("on the large rule after the small one filled: %+v, %v; want it admitted", res, err)
				}
				// Without Sharing the small rule has a state of its own.
				if res, err := lim.Allow(ctx, key, tc.small); err != nil || !res.Allowed {
					t.Fatalf("the small rule without Sharing: %+v, %v; want it admitted (its own state)", res, err)
				}
			})
		}
	})
}

// Two rules of one call cannot share a state, and a state name is 1 to
// MaxRuleName bytes.
func TestSharingInvalid(t *testing.T) {
	for _, rules := range [][]funnel.Rule{
		{funnel.Window(5, time.Minute).Sharing("a"), funnel.Window(10, time.Minute).Sharing("a")},
		{funnel.Window(5, time.Minute).Sharing("")},
		{funnel.Window(5, time.Minute).Sharing(string(make([]byte, funnel.MaxRuleName+1)))},
	} {
		if err := funnel.Validate(rules...); !errors.Is(err, funnel.ErrInvalidRule) {
			t.Errorf("Validate(%v) = %v; want ErrInvalidRule", rules, err)
		}
	}
	// One name, different periods or kinds: different states.
	if err := funnel.Validate(funnel.Window(5, time.Minute).Sharing("a"), funnel.Window(50, time.Hour).Sharing("a"),
		funnel.AtMost(5, time.Minute).Sharing("a")); err != nil {
		t.Errorf("Validate of one name over periods and kinds = %v", err)
	}
}
