package guard_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// enterCall is the result of an Enter run in a goroutine.
type enterCall struct {
	c   guard.Call
	err error
}

// TestEnterShadowAdmitsDenied: under Shadow, Enter admits the call the
// rule denies, with no error, and the real denial in Call.Decision and in
// FromContext(Call.Context()).
func TestEnterShadowAdmitsDenied(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		g := newGuard(t, b, guard.WithShadow(), guard.WithRules(funnel.Window(1, time.Hour)))
		first, err := g.Enter(ctx, "k", 1)
		first.Done()
		if err != nil || !first.Admitted() || !first.Decision.Allowed {
			t.Fatalf("first Enter = %+v, %v, admitted %v; want an admission", first.Decision, err, first.Admitted())
		}
		c, err := g.Enter(ctx, "k", 1)
		defer c.Done()
		if err != nil || !c.Admitted() {
			t.Fatalf("shadow Enter over the limit = %v, admitted %v; want admitted without error", err, c.Admitted())
		}
		if d := c.Decision; d.Allowed || d.Degraded || d.RetryAfter <= 0 || d.Rule == "" {
			t.Errorf("shadow Decision = %+v; want the rule's real denial", d)
		}
		if d, ok := guard.FromContext(c.Context()); !ok || d != c.Decision {
			t.Errorf("FromContext(Context()) = %+v, %v; want %+v", d, ok, c.Decision)
		}
		// Shadow still counts: AllowN reports the denial too.
		if d, err := g.Allow(ctx, "k"); err != nil || d.Allowed {
			t.Errorf("Allow after the shadow calls = %+v, %v; want a denial", d, err)
		}
	})
}

// TestEnterBusyRefunds: with InFlight 1, a second Enter of a key whose
// permit an entered Call holds waits in the key's queue, then is refused
// with ErrBusy and the ErrorRetryAfter denial; the unit its admission took
// is given back (Remaining), and Done frees the permit for the next call.
func TestEnterBusyRefunds(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		g := newGuard(t, b, guard.WithInFlight(1), guard.WithRules(funnel.Window(3, time.Hour)), guard.WithTimeout(2*time.Second))
		first, err := g.Enter(ctx, "k", 1)
		defer first.Done()
		if err != nil || !first.Admitted() {
			t.Fatalf("first Enter = %+v, %v", first.Decision, err)
		}
		got := make(chan enterCall, 1)
		go func() {
			c, err := g.Enter(ctx, "k", 1)
			got <- enterCall{c, err}
		}()
		var none atomic.Int64
		waitQueued(t, b.Client(t), semQueueKey(b.Prefix+"g:", "k"), 1, &none, 0) // it waits for the permit
		r := <-got
		r.c.Done() // holds nothing: safe
		if !errors.Is(r.err, guard.ErrBusy) || r.c.Admitted() {
			t.Fatalf("second Enter = %v, admitted %v; want ErrBusy", r.err, r.c.Admitted())
		}
		if d := r.c.Decision; d.Allowed || d.Degraded || d.RetryAfter != guard.DefaultErrorRetry {
			t.Errorf("busy Decision = %+v; want a denial with RetryAfter %v", d, guard.DefaultErrorRetry)
		}
		if d, err := g.Peek(ctx, "k"); err != nil || d.Remaining != 2 {
			t.Errorf("Peek after the busy call = %+v, %v; want 2 remaining (its unit refunded)", d, err)
		}
		first.Done()
		next, err := g.Enter(ctx, "k", 1)
		defer next.Done()
		if err != nil || !next.Admitted() {
			t.Errorf("Enter after Done = %+v, %v; want an admission with the permit back", next.Decision, err)
		}
	})
}

// TestEnterDoneOnce: Done gives a Call's place back once, whatever calls
// it again or on a copy: with InFlight 1 and Redis down (FailOpen counts
// the calls in this process), a second Done of a Call that ended must not
// give back the place of the call that took it since.
func TestEnterDoneOnce(t *testing.T) {
	ctx := context.Background()
	b := testutil.Mini(t)
	g := newGuard(t, b, guard.WithInFlight(1), guard.WithRules(plenty...), guard.WithOnError(guard.FailOpen))
	b.Mini.SetError("LOADING Redis is loading the dataset in memory")
	a, err := g.Enter(ctx, "k", 1)
	if err != nil || !a.Admitted() || !a.Decision.Degraded {
		t.Fatalf("Enter with Redis down = %+v, %v; want a degraded admission", a.Decision, err)
	}
	copied := a
	a.Done()
	held, err := g.Enter(ctx, "k", 1)
	defer held.Done()
	if err != nil || !held.Admitted() {
		t.Fatalf("Enter after Done = %+v, %v; want an admission", held.Decision, err)
	}
	a.Done()
	copied.Done()
	c, err := g.Enter(ctx, "k", 1)
	c.Done()
	if !errors.Is(err, guard.ErrBusy) || c.Admitted() {
		t.Errorf("Enter while one runs, after Done again = %v, admitted %v; want ErrBusy", err, c.Admitted())
	}
}

// TestEnterDegradedDenials: while Redis cannot answer, a denial of
// FailOpen's in-process rules or of the Fallback is a denial (no error,
// not admitted), as Middleware answers it 429; failing closed is
// ErrUnavailable.
func TestEnterDegradedDenials(t *testing.T) {
	rules := []funnel.Rule{funnel.Window(1, time.Hour)}
	for name, p := range map[string][]guard.Option{
		"FailOpen": {guard.WithRules(rules...), guard.WithOnError(guard.FailOpen)},
		"Fallback": {guard.WithRules(rules...), guard.WithFallback(guard.Fallback{Limit: 0.001, Burst: 1})},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := testutil.Mini(t)
			g := newGuard(t, b, p...)
			b.Mini.SetError("LOADING Redis is loading the dataset in memory")
			c, err := g.Enter(ctx, "k", 1)
			c.Done()
			if err != nil || !c.Admitted() || !c.Decision.Degraded {
				t.Fatalf("first Enter = %+v, %v; want a degraded admission", c.Decision, err)
			}
			c, err = g.Enter(ctx, "k", 1)
			c.Done()
			if err != nil || c.Admitted() {
				t.Fatalf("second Enter = %v, admitted %v; want a denial without error", err, c.Admitted())
			}
			if d := c.Decision; d.Allowed || !d.Degraded || d.RetryAfter <= 0 {
				t.Errorf("second Decision = %+v; want a degraded denial with a wait", d)
			}
		})
	}
	t.Run("FailClosed", func(t *testing.T) {
		b := testutil.Mini(t)
		g := newGuard(t, b, guard.WithRules(rules...))
		b.Mini.SetError("LOADING Redis is loading the dataset in memory")
		c, err := g.Enter(context.Background(), "k", 1)
		c.Done()
		if !errors.Is(err, guard.ErrUnavailable) || c.Admitted() || c.Decision.RetryAfter != guard.DefaultErrorRetry {
			t.Errorf("Enter failing closed = %+v, %v, admitted %v; want ErrUnavailable", c.Decision, err, c.Admitted())
		}
	})
}

// TestEnterInvalid: a bad key, a bad n and a nil context are errors, never
// admissions; Done on them and on the zero Call is safe, and the zero
// Call's Context is usable.
func TestEnterInvalid(t *testing.T) {
	b := testutil.Mini(t)
	g := newGuard(t, b, guard.WithShadow(), guard.WithInFlight(1), guard.WithRules(plenty...))
	ctx := context.Background()
	for _, tc := range []struct {
		ctx  context.Context
		key  string
		n    int64
		want error
	}{
		{ctx, "", 1, guard.ErrInvalidKey},
		{ctx, "k", 0, funnel.ErrInvalidN},
		{ctx, "k", 1001, funnel.ErrInvalidN}, // over the rule's capacity
		{nil, "k", 1, guard.ErrNilContext},
	} {
		c, err := g.Enter(tc.ctx, tc.key, tc.n)
		c.Done()
		if !errors.Is(err, tc.want) || c.Admitted() {
			t.Errorf("Enter(%q, %d) = %v, admitted %v; want %v (Shadow admits no bad call)", tc.key, tc.n, err, c.Admitted(), tc.want)
		}
	}
	var zero guard.Call
	zero.Done()
	if zero.Admitted() || zero.Context() == nil {
		t.Error("the zero Call is admitted, or has no Context")
	}
}

// TestEnterShadowBusy: under Shadow, a call that gets no permit within
// Timeout runs without one, as Middleware lets it.
func TestEnterShadowBusy(t *testing.T) {
	b := testutil.Mini(t)
	g := newGuard(t, b, guard.WithShadow(), guard.WithInFlight(1), guard.WithRules(plenty...), guard.WithTimeout(2*time.Second))
	ctx := context.Background()
	first, err := g.Enter(ctx, "k", 1)
	defer first.Done()
	if err != nil || !first.Admitted() {
		t.Fatalf("first Enter = %v", err)
	}
	c, err := g.Enter(ctx, "k", 1)
	defer c.Done()
	if err != nil || !c.Admitted() || !c.Decision.Allowed {
		t.Errorf("shadow Enter without a permit = %+v, %v, admitted %v; want it admitted", c.Decision, err, c.Admitted())
	}
}
