package guard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
	_ "time/tzdata" // America/New_York with Go alone

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// A PerDay budget in a guard: a denial's Retry-After is the time to local
// midnight, to the second, on the 23-hour day of a clock change too; Shadow
// lets the denial through with the real Decision. (The RateLimit fields of
// a calendar rule are not checked here: another change reworks them.)
func TestCalendarRuleInGuard(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	b := testutil.Mini(t)
	t0 := time.Date(2026, 3, 7, 20, 0, 0, 0, time.UTC) // 15:00 EST; midnight EST is 05:00 UTC
	rules := []funnel.Rule{funnel.PerDay(2, ny), funnel.Window(10, time.Hour)}
	for _, shadow := range []bool{false, true} {
		opts := []guard.Option{guard.WithPrefix(b.Prefix + map[bool]string{false: "c:", true: "s:"}[shadow]), guard.WithRules(rules...)}
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
		for i, at := range []time.Duration{0, time.Second} {
			if rec := serve(at); rec.Code != http.StatusAccepted {
				t.Fatalf("shadow %v, call %d: %d", shadow, i, rec.Code)
			}
		}
		rec := serve(time.Hour + 500*time.Millisecond) // 7h59m59.5s to midnight
		if shadow {
			if rec.Code != http.StatusAccepted {
				t.Fatalf("shadow: the third call got %d, want it let through", rec.Code)
			}
			d, err := g.Peek(context.Background(), "k")
			if err != nil || d.Allowed || d.Rule != rules[0].Name || d.RetryAfter != 8*time.Hour-500*time.Millisecond {
				t.Fatalf("shadow: Peek %+v, %v; want the budget's denial until midnight", d, err)
			}
			continue
		}
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "28800" {
			t.Fatalf("third call: %d, Retry-After %q; want 429 and 28800 (8 h, rounded up)", rec.Code, rec.Header().Get("Retry-After"))
		}
		// The next day is 23 hours long: its budget is back at 04:00 UTC.
		for i, at := range []time.Duration{9 * time.Hour, 9*time.Hour + time.Minute} {
			if rec := serve(at); rec.Code != http.StatusAccepted {
				t.Fatalf("after midnight, call %d: %d", i, rec.Code)
			}
		}
		if rec := serve(9*time.Hour + 2*time.Minute); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "82680" {
			t.Fatalf("a third on the 23-hour day: %d, Retry-After %q; want 429 and 82680 (22h58m)", rec.Code, rec.Header().Get("Retry-After"))
		}
	}
}

// While Redis cannot answer, a FailOpen guard decides a calendar budget in
// process: at most n per key, until the zone's midnight (a fixed zone whose
// midnight is 6 hours away).
func TestCalendarRuleFailOpen(t *testing.T) {
	b := testutil.Mini(t)
	midnight := time.Now().Add(6 * time.Hour).Truncate(time.Second)
	off := -int(midnight.Unix() % 86400)
	if off < -43200 {
		off += 86400
	}
	rule := funnel.PerDay(3, time.FixedZone("six-hours-to-midnight", off))
	g, err := guard.New(b.ClientOpts(t, &redis.Options{MaxRetries: -1}), guard.WithPrefix(b.Prefix), guard.WithOnError(guard.FailOpen), guard.WithRules(rule))
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
			continue
		}
		// Generous: the calls take less than a minute.
		if left := time.Until(midnight); d.Rule != rule.Name || d.RetryAfter > left+time.Second || d.RetryAfter < left-time.Minute {
			t.Fatalf("call %d: %+v; want the budget's denial until midnight, in about %v", i, d, left)
		}
	}
	if admitted != 3 {
		t.Fatalf("%d admitted while Redis was down, want 3", admitted)
	}
}
