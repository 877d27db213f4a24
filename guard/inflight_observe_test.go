package guard_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// Under InFlight, Observe sees a call once its permit is known: an
// admitted Do or Enter with Permit set and its wait; a call that got no
// permit as the ErrBusy refusal it was, not as the admission (metrics
// counted busy calls as allowed, and no wait for a permit). AllowN takes no
// permit and says none.
func TestInFlightObserved(t *testing.T) {
	ctx := context.Background()
	g, observed := observedGuard(t, 300*time.Millisecond)
	last := func() guard.Observation {
		obs := observed()
		return obs[len(obs)-1]
	}
	held, err := g.Enter(ctx, "k", 1)
	if err != nil || !held.Admitted() {
		t.Fatalf("Enter: %+v, %v", held, err)
	}
	if o := last(); !o.Permit || o.Err != nil || !o.Decision.Allowed || o.PermitWait <= 0 || o.Latency < o.PermitWait {
		t.Errorf("admitted Enter observed %+v; want Permit, its wait within Latency, allowed", o)
	}
	d, err := g.Do(ctx, "k", func(context.Context) error { return nil })
	if !errors.Is(err, guard.ErrBusy) || d.Allowed {
		t.Fatalf("Do while the permit is held: %+v, %v; want ErrBusy", d, err)
	}
	if o := last(); !o.Permit || !errors.Is(o.Err, guard.ErrBusy) || o.Decision.Allowed || o.PermitWait < 200*time.Millisecond {
		t.Errorf("busy Do observed %+v; want Permit, ErrBusy, a denial, a wait of about the Timeout", o)
	}
	if _, err := g.Enter(ctx, "k", 1); !errors.Is(err, guard.ErrBusy) {
		t.Fatalf("Enter while the permit is held: %v; want ErrBusy", err)
	}
	if o := last(); !o.Permit || !errors.Is(o.Err, guard.ErrBusy) || o.Decision.Allowed {
		t.Errorf("busy Enter observed %+v; want Permit, ErrBusy, a denial", o)
	}
	held.Done()
	if _, err := g.Allow(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if o := last(); o.Permit || o.PermitWait != 0 {
		t.Errorf("Allow observed %+v; want no permit", o)
	}
	if n := len(observed()); n != 4 {
		t.Errorf("%d observations; want 4, one per call", n)
	}
}

// observedGuard is a guard of one permit a key (WithInFlight(1)) and a
// Timeout of wait on a fresh miniredis, with opts, and the Observations it
// made so far.
func observedGuard(t *testing.T, wait time.Duration, opts ...guard.Option) (*guard.Guard, func() []guard.Observation) {
	var mu sync.Mutex
	var obs []guard.Observation
	g := newGuard(t, testutil.Mini(t), append([]guard.Option{
		guard.WithInFlight(1),
		guard.WithRules(funnel.AtMost(10, time.Hour)),
		guard.WithTimeout(wait),
		guard.WithObserve(func(o guard.Observation) {
			mu.Lock()
			defer mu.Unlock()
			obs = append(obs, o)
		}),
	}, opts...)...)
	return g, func() []guard.Observation {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(obs)
	}
}

// Under Shadow, Do still blocks a call that got no permit (it follows the
// real decision, as Allow does), so Observe sees that refusal, not the
// admission: a Do refused under Shadow was observed as admitted with no
// error.
func TestInFlightObservedShadowDo(t *testing.T) {
	ctx := context.Background()
	g, observed := observedGuard(t, 100*time.Millisecond, guard.WithShadow())
	held, err := g.Enter(ctx, "k", 1)
	if err != nil || !held.Admitted() {
		t.Fatalf("Enter: %+v, %v", held, err)
	}
	defer held.Done()
	ran := false
	d, err := g.Do(ctx, "k", func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, guard.ErrBusy) || d.Allowed || ran {
		t.Fatalf("shadow Do while the permit is held: %+v, %v, ran %v; want ErrBusy, not run", d, err, ran)
	}
	obs := observed()
	if last := obs[len(obs)-1]; !last.Permit || !errors.Is(last.Err, guard.ErrBusy) || last.Decision.Allowed {
		t.Errorf("shadow Do refused a permit observed %+v; want Permit, ErrBusy, a denial", last)
	}
}
