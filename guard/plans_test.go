package guard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// tenants is a PlanOf over plans kept in memory, changed at run time.
type tenants struct {
	mu   sync.Mutex
	plan map[string]string
}

func (t *tenants) set(key, plan string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.plan[key] = plan
}

func (t *tenants) planOf(_ context.Context, key string) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.plan[key]
	if !ok {
		return "", errors.New("unknown tenant")
	}
	return p, nil
}

var (
	freeRules = []funnel.Rule{funnel.Window(10, time.Minute), funnel.PerDay(100, time.UTC)}
	proRules  = []funnel.Rule{funnel.Window(1000, time.Minute), funnel.PerDay(100_000, time.UTC)}
)

func plansGuard(t *testing.T, b *testutil.Backend, ts *tenants, observe func(guard.Observation)) *guard.Guard {
	return newGuard(t, b,
		guard.WithRules(freeRules...),
		guard.WithRateLimitHeaders(),
		guard.WithObserve(observe),
		guard.WithPlans(map[string][]funnel.Rule{"free": freeRules, "pro": proRules}, ts.planOf),
	)
}

// A key's plan is read at each call: moved to a smaller plan it is judged by
// it at once on what it took under the larger one; moved back, it has the
// larger plan's room less what it took. (50 calls of the minute deny it
// under free, 10 a minute and 100 a day, until they are a minute old.)
func TestPlansMoveKeepsUsage(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		ts := &tenants{plan: map[string]string{"acme": "pro", "tiny": "free"}}
		var mu sync.Mutex
		var plans []string
		g := plansGuard(t, b, ts, func(o guard.Observation) {
			mu.Lock()
			defer mu.Unlock()
			plans = append(plans, o.Plan)
		})
		if d, err := g.AllowN(ctx, "acme", 50); err != nil || !d.Allowed {
			t.Fatalf("50 calls under pro: %+v, %v", d, err)
		}
		if d, err := g.AllowN(ctx, "tiny", 11); err == nil || d.Allowed {
			t.Fatalf("11 calls under free: %+v, %v; want refused (over its capacity)", d, err)
		}
		ts.set("acme", "free")
		d, err := g.Allow(ctx, "acme")
		if err != nil || d.Allowed || d.Rule != freeRules[0].Name || d.RetryAfter <= 0 || d.RetryAfter > time.Minute {
			t.Fatalf("the next call under free: %+v, %v; want a denial by %q within the minute", d, err, freeRules[0].Name)
		}
		ts.set("acme", "pro")
		d, err = g.Allow(ctx, "acme")
		if err != nil || !d.Allowed || d.Remaining != 949 {
			t.Fatalf("back under pro: %+v, %v; want admitted with 949 left", d, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"pro", "free", "free", "pro"}; strings.Join(plans, ",") != strings.Join(want, ",") {
			t.Errorf("observed plans %q; want %q", plans, want)
		}
	})
}

// Middleware's RateLimit-Policy lists the rules of the key's plan.
func TestPlansRateLimitPolicy(t *testing.T) {
	b := testutil.Mini(t)
	ts := &tenants{plan: map[string]string{"acme": "pro", "tiny": "free", "new": ""}}
	g := plansGuard(t, b, ts, nil)
	h := g.Middleware(guard.Header("X-Tenant"))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for tenant, want := range map[string]string{"acme": `"1000 in 1m0s";q=1000`, "tiny": `"10 in 1m0s";q=10`, "new": `"10 in 1m0s";q=10`} {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Tenant", tenant)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if got := rec.Header().Get("RateLimit-Policy"); rec.Code != http.StatusOK || !strings.HasPrefix(got, want) {
			t.Errorf("%s: %d, RateLimit-Policy %s; want it to start %s", tenant, rec.Code, got, want)
		}
	}
}

// The plans' rules of one kind and period share a key's state whatever
// their order: free lists its day first, pro its minute first, and a key
// that took 40 under pro is denied by free's 30 a day at once (listed in
// another order, the day's count would start again from 0).
func TestPlansShareByKindNotOrder(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		day := funnel.PerDay(30, time.UTC)
		free := []funnel.Rule{day, funnel.Window(100, time.Minute)}
		pro := []funnel.Rule{funnel.Window(1000, time.Minute), funnel.PerDay(100_000, time.UTC)}
		ts := &tenants{plan: map[string]string{"acme": "pro"}}
		g := newGuard(t, b, guard.WithRules(free...), guard.WithPlans(map[string][]funnel.Rule{"free": free, "pro": pro}, ts.planOf))
		if d, err := g.AllowN(ctx, "acme", 40); err != nil || !d.Allowed {
			t.Fatalf("40 under pro: %+v, %v", d, err)
		}
		ts.set("acme", "free")
		if d, err := g.Allow(ctx, "acme"); err != nil || d.Allowed || d.Rule != day.Name {
			t.Fatalf("the next call under free: %+v, %v; want a denial by %q, on the 40 taken under pro", d, err, day.Name)
		}
	})
}

// A plan's rules named after it make RateLimit-Policy name the plan; the
// names do not part the key's state (the i-th rules share it whatever
// their names): moved from pro after 50 calls, a key is denied by "free".
func TestPlansNamedRules(t *testing.T) {
	b := testutil.Mini(t)
	named := func(r funnel.Rule, name string) funnel.Rule { r.Name = name; return r }
	free := []funnel.Rule{named(funnel.Window(10, time.Minute), "free")}
	pro := []funnel.Rule{named(funnel.Window(1000, time.Minute), "pro")}
	ts := &tenants{plan: map[string]string{"acme": "pro"}}
	g := newGuard(t, b,
		guard.WithRules(free...),
		guard.WithRateLimitHeaders(),
		guard.WithPlans(map[string][]funnel.Rule{"free": free, "pro": pro}, ts.planOf),
	)
	h := g.Middleware(guard.Header("X-Tenant"))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	serve := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Tenant", "acme")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := serve(); rec.Code != http.StatusOK || rec.Header().Get("RateLimit-Policy") != `"pro";q=1000;w=60` {
		t.Fatalf("under pro: %d, RateLimit-Policy %q", rec.Code, rec.Header().Get("RateLimit-Policy"))
	}
	if d, err := g.AllowN(context.Background(), "acme", 49); err != nil || !d.Allowed {
		t.Fatalf("49 more under pro: %+v, %v", d, err)
	}
	ts.set("acme", "free")
	rec := serve()
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("RateLimit-Policy") != `"free";q=10;w=60` ||
		!strings.HasPrefix(rec.Header().Get("RateLimit"), `"free";r=0;`) {
		t.Fatalf("under free after 50: %d, RateLimit-Policy %q, RateLimit %q; want 429 by \"free\"",
			rec.Code, rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"))
	}
}

// A key without a plan (PlanOf's error, or a name not in Plans) is refused
// with ErrPlan and takes nothing; Middleware answers 503 with Retry-After.
func TestPlansUnknown(t *testing.T) {
	b := testutil.Mini(t)
	ctx := context.Background()
	ts := &tenants{plan: map[string]string{"ghost": "enterprise"}}
	g := plansGuard(t, b, ts, nil)
	for _, key := range []string{"ghost", "stranger"} {
		d, err := g.Allow(ctx, key)
		if !errors.Is(err, guard.ErrPlan) || d.Allowed || d.RetryAfter <= 0 {
			t.Errorf("Allow(%q) = %+v, %v; want ErrPlan and a denial with RetryAfter", key, d, err)
		}
		if _, err := g.Peek(ctx, key); !errors.Is(err, guard.ErrPlan) {
			t.Errorf("Peek(%q): %v; want ErrPlan", key, err)
		}
		if err := g.Refund(ctx, key); !errors.Is(err, guard.ErrPlan) {
			t.Errorf("Refund(%q): %v; want ErrPlan", key, err)
		}
	}
	if keys := b.Mini.Keys(); len(keys) != 0 {
		t.Errorf("keys written for calls without a plan: %q", keys)
	}
	h := g.Middleware(guard.Header("X-Tenant"))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("a request without a plan reached the handler")
	}))
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("X-Tenant", "ghost")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Errorf("Middleware for a key without a plan: %d %q; want 503 with Retry-After", rec.Code, rec.Body)
	}
}

// Plans and PlanOf go together, and every plan's rules are checked.
func TestPlansInvalid(t *testing.T) {
	b := testutil.Mini(t)
	planOf := func(context.Context, string) (string, error) { return "", nil }
	for name, p := range map[string][]guard.Option{
		"WithPlans without planOf": {guard.WithRules(freeRules...), guard.WithPlans(map[string][]funnel.Rule{"pro": proRules}, nil)},
		"WithPlans without plans":  {guard.WithRules(freeRules...), guard.WithPlans(nil, planOf)},
		"an empty plan":            {guard.WithRules(freeRules...), guard.WithPlans(map[string][]funnel.Rule{"pro": nil}, planOf)},
		"a plan named \"\"":        {guard.WithRules(freeRules...), guard.WithPlans(map[string][]funnel.Rule{"": proRules}, planOf)},
		"a bad rule":               {guard.WithRules(freeRules...), guard.WithPlans(map[string][]funnel.Rule{"pro": {{Name: "x", Capacity: -1}}}, planOf)},
	} {
		if _, err := guard.New(b.Client(t), p...); !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("%s: %v; want ErrInvalidOption", name, err)
		}
	}
	// Plans without Rules: the error says what Rules are for (a new user
	// gave only Plans and read "no rules").
	_, err := guard.New(b.Client(t), guard.WithPlans(map[string][]funnel.Rule{"free": freeRules}, planOf))
	if !errors.Is(err, guard.ErrInvalidOption) || !strings.Contains(err.Error(), `Rules decide the keys whose plan is ""`) {
		t.Errorf("WithPlans without WithRules: %v; want ErrInvalidOption saying what WithRules decide", err)
	}
}

// planKey carries a call's plan in its context, for the race below.
type planKey struct{}

// Calls of one key under two plans at once, each call's plan its own: every
// admission is one step of the key's one window (the count after it, its
// plan's capacity less Remaining, is 1, 2, 3... with no step twice or
// missing), and no admission under free came past its 10th unit.
func TestPlansRace(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		free, pro := funnel.Window(10, time.Minute), funnel.Window(1000, time.Minute)
		g := newGuard(t, b,
			guard.WithRules(free),
			guard.WithTimeout(10*time.Second),
			guard.WithPlans(map[string][]funnel.Rule{"free": {free}, "pro": {pro}}, func(ctx context.Context, _ string) (string, error) {
				p, _ := ctx.Value(planKey{}).(string)
				return p, nil
			}),
		)
		const goroutines, calls = 16, 20
		var mu sync.Mutex
		counts := map[int64]string{}
		var wg sync.WaitGroup
		for i := range goroutines {
			wg.Go(func() {
				for j := range calls {
					plan, capacity := "free", free.Capacity
					if (i+j)%2 == 0 {
						plan, capacity = "pro", pro.Capacity
					}
					d, err := g.Allow(context.WithValue(context.Background(), planKey{}, plan), "acme")
					if err != nil {
						t.Error(err)
						return
					}
					if !d.Allowed {
						continue
					}
					mu.Lock()
					n := capacity - d.Remaining
					if prev, dup := counts[n]; dup {
						t.Errorf("two admissions (%s and %s) left the window at %d units", prev, plan, n)
					}
					counts[n] = plan
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		for n := int64(1); n <= int64(len(counts)); n++ {
			plan, ok := counts[n]
			switch {
			case !ok:
				t.Errorf("no admission left the window at %d units of %d admissions", n, len(counts))
			case plan == "free" && n > free.Capacity:
				t.Errorf("an admission under free left %d units in its window of %d", n, free.Capacity)
			}
		}
		if len(counts) < goroutines*calls/2 {
			t.Errorf("%d admissions; want every one of the %d under pro at least", len(counts), goroutines*calls/2)
		}
	})
}
