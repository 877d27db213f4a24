package guard_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// rateLimitServer serves requests for one key at times after t0 on a
// miniredis clock, and returns the status, Retry-After and the RateLimit
// field without its pk (checked to be the same every time).
type rateLimitServer struct {
	t  *testing.T
	b  *testutil.Backend
	h  http.Handler
	t0 time.Time
	pk string
	// last is the latest response.
	last *httptest.ResponseRecorder
}

func newRateLimitServer(t *testing.T, rules ...funnel.Rule) *rateLimitServer {
	b := testutil.Mini(t)
	t0 := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	b.Mini.SetTime(t0)
	g := newGuard(t, b, guard.WithRateLimitHeaders(), guard.WithRules(rules...))
	h := g.Middleware(func(*http.Request) (string, error) { return "+8613600000009", nil })(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	return &rateLimitServer{t: t, b: b, h: h, t0: t0}
}

func (s *rateLimitServer) serve(at time.Duration) *httptest.ResponseRecorder {
	s.t.Helper()
	s.b.Mini.SetTime(s.t0.Add(at))
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/send", nil))
	s.last = rec
	return rec
}

// call returns "<status> <RateLimit item>", and Retry-After on a 429.
func (s *rateLimitServer) call(at time.Duration) string {
	s.t.Helper()
	rec := s.serve(at)
	item, pk, _ := strings.Cut(rec.Header().Get("RateLimit"), ";pk=")
	switch {
	case !regexp.MustCompile(`^:[A-Za-z0-9+/]{12}:$`).MatchString(pk):
		s.t.Fatalf("+%v: RateLimit %q: want a pk", at, rec.Header().Get("RateLimit"))
	case s.pk == "":
		s.pk = pk
	case pk != s.pk:
		s.t.Fatalf("+%v: pk %s, then %s for the same key", at, s.pk, pk)
	}
	out := fmt.Sprintf("%d %s", rec.Code, item)
	if rec.Code == http.StatusTooManyRequests {
		out += " Retry-After " + rec.Header().Get("Retry-After")
	}
	return out
}

// The README's policy: each rule's own q and w in RateLimit-Policy, and the
// RateLimit field for the rule with the least room, with its own r and t:
// the cooldown while the windows have room, then the hour once it is full
// (0 left there too, and its units come back last), then the day; a 429
// names the rule that denied, with r=0 and t its Retry-After.
func TestRateLimitHeadersSeveralRules(t *testing.T) {
	s := newRateLimitServer(t, funnel.AtMost(1, time.Minute), funnel.Window(5, time.Hour), funnel.Window(10, 24*time.Hour))
	m := time.Minute
	for _, step := range []struct {
		at   time.Duration
		want string
	}{
		{0, `200 "1/1m0s";r=0;t=60`},
		{30 * time.Second, `429 "1/1m0s";r=0;t=30 Retry-After 30`},
		{m + 500*time.Millisecond, `200 "1/1m0s";r=0;t=60`},
		{2 * m, `429 "1/1m0s";r=0;t=1 Retry-After 1`},
		{3 * m, `200 "1/1m0s";r=0;t=60`},
		{4 * m, `200 "1/1m0s";r=0;t=60`},
		// The fifth in the hour: the hour is as full as the cooldown, and
		// gives its units back last.
		{5 * m, `200 "5 in 1h0m0s";r=0;t=3600`},
		{6 * m, `429 "5 in 1h0m0s";r=0;t=3240 Retry-After 3240`},
		// The first unit leaves the hour: the hour is full again at once.
		{60 * m, `200 "5 in 1h0m0s";r=0;t=3600`},
		{66 * m, `200 "1/1m0s";r=0;t=60`},
		{120 * m, `200 "1/1m0s";r=0;t=60`},
		{121 * m, `200 "1/1m0s";r=0;t=60`},
		// The tenth in the day, with room left in the hour.
		{122 * m, `200 "10 in 24h0m0s";r=0;t=86400`},
		{123 * m, `429 "10 in 24h0m0s";r=0;t=79020 Retry-After 79020`},
		// The first unit leaves the day: the day is full again at once.
		{24 * time.Hour, `200 "10 in 24h0m0s";r=0;t=86400`},
	} {
		if got := s.call(step.at); got != step.want {
			t.Fatalf("+%v: %s, want %s", step.at, got, step.want)
		}
		// The quotas, whatever the state.
		if got, want := s.last.Header().Get("RateLimit-Policy"), `"1/1m0s";q=1;w=60, "5 in 1h0m0s";q=5;w=3600, "10 in 24h0m0s";q=10;w=86400`; got != want {
			t.Fatalf("+%v: RateLimit-Policy %s, want %s", step.at, got, want)
		}
	}
}

// A funnel of Capacity 10 leaking 10 a second is "19 per second", and the
// limiter proves it: 10 at once, then one every 100ms (each as early as it
// fits, so no schedule admits more by any time) gets 19 through within one
// second, and nothing else fits in it, the 20th not even at its last µs.
func TestRateLimitHeadersFunnelQuota(t *testing.T) {
	s := newRateLimitServer(t, funnel.Rule{Name: "ten", Capacity: 10, Leak: 10, Per: time.Second})
	admitted := 0
	try := func(at time.Duration, want int) {
		if got := s.serve(at).Code; got != want {
			t.Fatalf("+%v, after %d admitted: %d, want %d", at, admitted, got, want)
		}
		if want == http.StatusOK {
			admitted++
		}
	}
	for range 10 {
		try(0, http.StatusOK)
	}
	if got, want := s.last.Header().Get("RateLimit-Policy"), `"ten";q=19;w=1`; got != want {
		t.Fatalf("RateLimit-Policy %s, want %s", got, want)
	}
	try(0, http.StatusTooManyRequests)
	for k := 1; k <= 9; k++ {
		at := time.Duration(k) * 100 * time.Millisecond
		try(at-time.Microsecond, http.StatusTooManyRequests)
		try(at, http.StatusOK)
		try(at, http.StatusTooManyRequests)
	}
	try(time.Second-time.Microsecond, http.StatusTooManyRequests)
	if admitted != 19 {
		t.Fatalf("%d admitted within a second, want 19", admitted)
	}
	// The window moves on: the 20th fits at +1s, out of [0, 1s).
	if got, want := s.call(time.Second), `200 "ten";r=0;t=1`; got != want {
		t.Fatalf("+1s: %s, want %s", got, want)
	}
	if got, want := s.call(time.Second+time.Millisecond), `429 "ten";r=0;t=1 Retry-After 1`; got != want {
		t.Fatalf("+1.001s: %s, want %s", got, want)
	}
}

// A denial by the penalty box is no rule's: the RateLimit field names an
// item of RateLimit-Policy, the rule with the least room, with r=0 and t the
// end of the box.
func TestRateLimitHeadersPenaltyBox(t *testing.T) {
	b := testutil.Mini(t)
	b.Mini.SetTime(time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC))
	g := newGuard(t, b,
		guard.WithRateLimitHeaders(),
		guard.WithRules(oneAnHour...),
		guard.WithFunnel(funnel.WithPenalty(funnel.Penalty{Denials: 2, Within: time.Minute, For: 24 * time.Hour})),
	)
	h := g.Middleware(keyFromHeader)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var got []string
	for range 4 {
		item, _, _ := strings.Cut(serve(h, "guesser").Header().Get("RateLimit"), ";pk=")
		got = append(got, item)
	}
	want := []string{`"1/1h0m0s";r=0;t=3600`, `"1/1h0m0s";r=0;t=3600`, `"1/1h0m0s";r=0;t=86400`, `"1/1h0m0s";r=0;t=86400`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("RateLimit %q, want %q", got, want)
	}
}

// A 429 names the rule that denied, even when another has as few units
// left and is empty later: the client must wait for the denying one.
func TestRateLimitHeadersDenyingRule(t *testing.T) {
	s := newRateLimitServer(t, funnel.AtMost(1, 10*time.Minute), funnel.Window(2, time.Hour))
	for _, step := range []struct {
		at   time.Duration
		want string
	}{
		{0, `200 "1/10m0s";r=0;t=600`},
		{59 * time.Minute, `200 "2 in 1h0m0s";r=0;t=3600`},
		// Both full; the window empties last, the cooldown admits last.
		{59*time.Minute + 30*time.Second, `429 "1/10m0s";r=0;t=570 Retry-After 570`},
	} {
		if got := s.call(step.at); got != step.want {
			t.Fatalf("+%v: %s, want %s", step.at, got, step.want)
		}
	}
}
