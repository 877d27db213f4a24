package guard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// A Window rule in a guard: the RateLimit fields give its n and its window
// (and the funnel's, 10 at once then one every 6 minutes, 19 an hour),
// a denial's Retry-After is when its oldest unit leaves, exactly; Shadow
// lets the denial through with the real Decision; FailOpen decides it in
// process.
func TestWindowRuleInGuard(t *testing.T) {
	b := testutil.Mini(t)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	b.Mini.SetTime(t0)
	rules := []funnel.Rule{funnel.Window(2, time.Minute), {Name: "hour", Capacity: 10, Leak: 10, Per: time.Hour}}
	for _, shadow := range []bool{false, true} {
		opts := []guard.Option{guard.WithPrefix(b.Prefix + map[bool]string{false: "w:", true: "s:"}[shadow]), guard.WithRules(rules...), guard.WithRateLimitHeaders()}
		if shadow {
			opts = append(opts, guard.WithShadow())
		}
		g := newGuard(t, b, opts...)
		h := g.Middleware(func(*http.Request) (string, error) { return "k", nil })(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusAccepted)
		}))
		serve := func(at time.Duration) *httptest.ResponseRecorder {
			b.Mini.SetTime(t0.Add(at))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/send", nil))
			return rec
		}
		for i, at := range []time.Duration{0, 20 * time.Second} {
			if rec := serve(at); rec.Code != http.StatusAccepted {
				t.Fatalf("shadow %v, call %d: %d", shadow, i, rec.Code)
			}
		}
		rec := serve(30 * time.Second)
		if got, want := rec.Header().Get("RateLimit-Policy"), `"2 in 1m0s";q=2;w=60, "hour";q=19;w=3600`; got != want {
			t.Errorf("RateLimit-Policy %q, want %q", got, want)
		}
		if got, want := rec.Header().Get("RateLimit"), `"2 in 1m0s";r=0;t=30`; !shadow && !strings.Contains(got, want) {
			t.Errorf("RateLimit %q, want it to hold %q", got, want)
		}
		if shadow {
			if rec.Code != http.StatusAccepted {
				t.Fatalf("shadow: the third call got %d, want it let through", rec.Code)
			}
			d, err := g.Peek(context.Background(), "k")
			if err != nil || d.Allowed || d.Rule != "2 in 1m0s" || d.RetryAfter != 30*time.Second {
				t.Fatalf("shadow: Peek %+v, %v; want the window's denial for 30s", d, err)
			}
			continue
		}
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "30" {
			t.Fatalf("third call: %d, Retry-After %q; want 429 and 30", rec.Code, rec.Header().Get("Retry-After"))
		}
		if rec := serve(time.Minute - time.Microsecond); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
			t.Fatalf("1µs before the oldest unit leaves: %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
		}
		if rec := serve(time.Minute); rec.Code != http.StatusAccepted {
			t.Fatalf("when the oldest unit leaves: %d", rec.Code)
		}
	}
}

// While Redis cannot answer, a FailOpen guard decides a window in process:
// at most n per key.
func TestWindowRuleFailOpen(t *testing.T) {
	b := testutil.Mini(t)
	g, err := guard.New(b.ClientOpts(t, &redis.Options{MaxRetries: -1}), guard.WithPrefix(b.Prefix), guard.WithOnError(guard.FailOpen), guard.WithRules(funnel.Window(3, time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	b.Mini.SetError("LOADING Redis is loading the dataset in memory")
	admitted := 0
	for i := range 10 {
		d, err := g.Allow(context.Background(), "k")
		if !d.Degraded || !errors.Is(err, guard.ErrUnavailable) {
			t.Fatalf("call %d: %+v, %v", i, d, err)
		}
		if d.Allowed {
			admitted++
		} else if d.Rule != "3 in 1h0m0s" || d.RetryAfter <= 59*time.Minute {
			t.Fatalf("call %d: %+v; want the window's denial for about an hour", i, d)
		}
	}
	if admitted != 3 {
		t.Fatalf("%d admitted while Redis was down, want 3", admitted)
	}
}
