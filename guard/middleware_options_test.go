package guard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// oneAnHour admits one call per key per hour.
var oneAnHour = []funnel.Rule{funnel.AtMost(1, time.Hour)}

// seen records what the guarded handler saw of each request.
type seen struct {
	mu        sync.Mutex
	decisions []guard.Decision
	without   int // requests that reached the handler with no Decision
}

func (s *seen) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if d, ok := guard.FromContext(r.Context()); ok {
			s.decisions = append(s.decisions, d)
		} else {
			s.without++
		}
		w.WriteHeader(http.StatusAccepted)
	})
}

func TestMiddlewareHandlers(t *testing.T) {
	b := testutil.Mini(t)
	g := newGuard(t, b, guard.WithRules(oneAnHour...))
	var denied []guard.Decision
	var failed []error
	h := g.Middleware(keyFromHeader,
		guard.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, d guard.Decision) {
			denied = append(denied, d)
			w.WriteHeader(http.StatusTeapot)
		}),
		guard.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, d guard.Decision, err error) {
			failed = append(failed, err)
			w.WriteHeader(http.StatusBadGateway)
		}),
	)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) }))

	if rec := serve(h, "a"); rec.Code != http.StatusAccepted {
		t.Fatalf("first = %d", rec.Code)
	}
	if rec := serve(h, "a"); rec.Code != http.StatusTeapot || len(denied) != 1 || denied[0].Allowed || denied[0].RetryAfter <= 0 {
		t.Fatalf("denied: %d, handler got %+v", rec.Code, denied)
	}
	if rec := serve(h, ""); rec.Code != http.StatusBadGateway || len(failed) != 1 || !errors.Is(failed[0], guard.ErrInvalidKey) {
		t.Fatalf("no key: %d, handler got %v", rec.Code, failed)
	}
	b.Mini.SetError("MASTERDOWN Link with MASTER is down")
	if rec := serve(h, "b"); rec.Code != http.StatusBadGateway || len(failed) != 2 || !errors.Is(failed[1], guard.ErrUnavailable) {
		t.Fatalf("Redis down: %d, handler got %v", rec.Code, failed)
	}
}

func TestMiddlewareSkipAndContext(t *testing.T) {
	b := testutil.Mini(t)
	g := newGuard(t, b, guard.WithRules(oneAnHour...))
	var s seen
	h := g.Middleware(keyFromHeader, guard.WithSkip(func(r *http.Request) bool {
		return r.Header.Get("X-Health") != ""
	}))(s.handler())
	for range 5 { // skipped: nothing charged, no Decision
		req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
		req.Header.Set("X-Key", "a")
		req.Header.Set("X-Health", "1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusAccepted {
			t.Fatalf("skipped request = %d", rec.Code)
		}
	}
	if rec := serve(h, "a"); rec.Code != http.StatusAccepted {
		t.Fatalf("first guarded request after 5 skipped = %d: the skipped ones were charged", rec.Code)
	}
	if rec := serve(h, "a"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second guarded request = %d, want 429", rec.Code)
	}
	if s.without != 5 || len(s.decisions) != 1 || !s.decisions[0].Allowed || s.decisions[0].Remaining != 0 {
		t.Fatalf("handler saw %d requests without a Decision and %+v", s.without, s.decisions)
	}
	if _, ok := guard.FromContext(httptest.NewRequest(http.MethodGet, "/", nil).Context()); ok {
		t.Fatal("FromContext found a Decision in a request no Middleware saw")
	}
}

func TestMiddlewareCost(t *testing.T) {
	b := testutil.Mini(t)
	g := newGuard(t, b, guard.WithRules(funnel.AtMost(5, time.Hour)))
	var s seen
	h := g.Middleware(keyFromHeader, guard.WithCost(func(r *http.Request) (int64, error) {
		return strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
	}))(s.handler())
	req := func(cost string) int {
		r := httptest.NewRequest(http.MethodPost, "/batch", nil)
		r.Header.Set("X-Key", "a")
		r.Header.Set("X-Cost", cost)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	for _, tc := range []struct {
		cost string
		want int
	}{{"3", 202}, {"3", 429}, {"2", 202}, {"1", 429}, {"0", 400}, {"-1", 400}, {"x", 400}} {
		if got := req(tc.cost); got != tc.want {
			t.Fatalf("cost %s = %d, want %d", tc.cost, got, tc.want)
		}
	}
}

func TestMiddlewareShadow(t *testing.T) {
	b := testutil.Mini(t)
	var mu sync.Mutex
	var obs []guard.Observation
	g := newGuard(t, b,
		guard.WithRules(oneAnHour...),
		guard.WithShadow(),
		guard.WithRateLimitHeaders(),
		guard.WithObserve(func(o guard.Observation) {
			mu.Lock()
			obs = append(obs, o)
			mu.Unlock()
		}),
	)
	var s seen
	h := g.Middleware(keyFromHeader)(s.handler())
	for i := range 3 {
		rec := serve(h, "a")
		if rec.Code != http.StatusAccepted {
			t.Fatalf("request %d in shadow mode = %d, want it let through", i, rec.Code)
		}
		if rec.Header().Get("RateLimit") == "" {
			t.Fatalf("request %d: no RateLimit field in shadow mode", i)
		}
	}
	if len(s.decisions) != 3 || !s.decisions[0].Allowed || s.decisions[1].Allowed || s.decisions[2].Allowed {
		t.Fatalf("the handler saw %+v, want the real decisions: admitted, denied, denied", s.decisions)
	}
	if len(obs) != 3 || !obs[0].Shadow || !obs[2].Shadow || obs[2].Decision.Allowed {
		t.Fatalf("observations = %+v, want 3 with Shadow set", obs)
	}
	b.Mini.SetError("MASTERDOWN Link with MASTER is down")
	if rec := serve(h, "b"); rec.Code != http.StatusAccepted {
		t.Fatalf("Redis down in shadow mode = %d, want the request let through", rec.Code)
	}
}

func TestPenaltyBox(t *testing.T) {
	b := testutil.Mini(t)
	b.Mini.SetTime(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	g := newGuard(t, b, guard.WithRules(oneAnHour...), guard.WithFunnel(funnel.WithPenalty(funnel.Penalty{Denials: 3, Within: time.Minute, For: 15 * time.Minute})))
	var s seen
	h := g.Middleware(keyFromHeader)(s.handler())
	var codes []int
	for range 6 {
		codes = append(codes, serve(h, "guesser").Code)
	}
	d, err := g.Peek(context.Background(), "guesser")
	if err != nil || d.Rule != funnel.PenaltyRule || d.RetryAfter != 15*time.Minute {
		t.Fatalf("Peek after 6 calls = %+v, %v; want the penalty box, 15m", d, err)
	}
	if want := []int{202, 429, 429, 429, 429, 429}; !slices.Equal(codes, want) {
		t.Fatalf("codes = %v, want %v", codes, want)
	}
	if _, err := guard.New(b.Client(t), guard.WithRules(oneAnHour...), guard.WithFunnel(funnel.WithPenalty(funnel.Penalty{Denials: 0, Within: time.Minute, For: time.Minute}))); !errors.Is(err, guard.ErrInvalidOption) {
		t.Fatalf("a guard with a bad Penalty: %v, want ErrInvalidOption", err)
	}
}

// The default answers to a KeyFunc's errors: 413, 415, 400, 500.
func TestMiddlewareKeyErrors(t *testing.T) {
	b := testutil.Mini(t)
	g := newGuard(t, b, guard.WithRules(oneAnHour...))
	var s seen
	for _, tc := range []struct {
		name   string
		key    guard.KeyFunc
		ctype  string
		body   string
		status int
	}{
		{"too large", guard.JSONField("phone", 8), "application/json", `{"phone":"+8613800138000"}`, http.StatusRequestEntityTooLarge},
		{"wrong type", guard.JSONField("phone", 1024), "text/plain", `{"phone":"+8613800138000"}`, http.StatusUnsupportedMediaType},
		{"no field", guard.JSONField("phone", 1024), "application/json", `{"tel":"1"}`, http.StatusBadRequest},
		{"bad KeyFunc", guard.Join(), "application/json", `{}`, http.StatusInternalServerError},
		{"ok", guard.JSONField("phone", 1024), "application/json", `{"phone":"+8613800138000"}`, http.StatusAccepted},
	} {
		r := httptest.NewRequest(http.MethodPost, "/send", strings.NewReader(tc.body))
		r.Header.Set("Content-Type", tc.ctype)
		w := httptest.NewRecorder()
		g.Middleware(tc.key)(s.handler()).ServeHTTP(w, r)
		if w.Code != tc.status {
			t.Errorf("%s: %d, want %d (%s)", tc.name, w.Code, tc.status, w.Body)
		}
	}
}

// On a real server: a brute force of 200 calls on one key. The rule admits
// 5, denies 9, and the 10th denial within the minute boxes the key for 2 s:
// the other 186 are the box's, none admitted. When the box ends on the
// server's clock (RetryAfter), the rule decides again.
func TestPenaltyBoxBruteForceRealServer(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	rule := funnel.AtMost(5, time.Hour)
	g := newGuard(t, b, guard.WithRules(rule), guard.WithFunnel(funnel.WithPenalty(funnel.Penalty{Denials: 10, Within: time.Minute, For: 2 * time.Second})))
	count := map[string]int{}
	for range 200 {
		d, err := g.Allow(ctx, "+8613800138000")
		switch {
		case err != nil:
			t.Fatal(err)
		case d.Allowed:
			count["admitted"]++
		case d.Rule == funnel.PenaltyRule:
			count["box"]++
			if d.RetryAfter <= 0 || d.RetryAfter > 2*time.Second {
				t.Fatalf("a boxed denial: RetryAfter %v, want (0, 2s]", d.RetryAfter)
			}
		case d.Rule == rule.Name:
			count["rule"]++
		}
	}
	if count["admitted"] != 5 || count["rule"] != 9 || count["box"] != 186 {
		t.Fatalf("200 calls: %v; want 5 admitted, 9 denied by the rule, 186 by the box", count)
	}
	d, err := g.Peek(ctx, "+8613800138000")
	if err != nil || d.Rule != funnel.PenaltyRule {
		t.Fatalf("Peek = %+v, %v; want the box", d, err)
	}
	time.Sleep(d.RetryAfter + 10*time.Millisecond) // the box's end, as the server counts it
	if d, err := g.Allow(ctx, "+8613800138000"); err != nil || d.Allowed || d.Rule != rule.Name {
		t.Fatalf("after the box: %+v, %v; want a denial by the rule", d, err)
	}
}
