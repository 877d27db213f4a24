package guard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// Fail fast: a guard whose Redis refuses connections answers by its OnError
// at once, not at the end of its Timeout, for every caller of a key at the
// same time; each refusal here takes 200 ms, and 16 in a row would take
// 3.2 s of the 5 s Timeout.
func TestRefusedAnswersAtOnce(t *testing.T) {
	rules := []funnel.Rule{funnel.AtMost(1, time.Minute)}
	for _, mode := range []guard.FailureMode{guard.FailClosed, guard.FailOpen} {
		r := testutil.NewRefused(t, 200*time.Millisecond)
		g, err := guard.New(r.Client(t), guard.WithPrefix(testutil.NewPrefix()), guard.WithRules(rules...), guard.WithOnError(mode), guard.WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		admitted := 0
		for i := range 16 {
			wg.Go(func() {
				start := time.Now()
				d, err := g.Allow(context.Background(), "+15550100")
				took := time.Since(start)
				if took > time.Second || !d.Degraded || !errors.Is(err, guard.ErrUnavailable) || !errors.Is(err, funnel.ErrUnreachable) {
					t.Errorf("OnError %d, caller %d: %+v, %v after %v; want a degraded decision with ErrUnavailable and ErrUnreachable within 1s", mode, i, d, err, took)
				}
				mu.Lock()
				defer mu.Unlock()
				if d.Allowed {
					admitted++
				}
			})
		}
		wg.Wait()
		want := map[guard.FailureMode]int{guard.FailClosed: 0, guard.FailOpen: 1}[mode] // FailOpen: the rules, in-process
		if admitted != want {
			t.Errorf("OnError %d: %d admitted, want %d", mode, admitted, want)
		}
	}
}

// The middleware of a FailClosed guard answers 503 with Retry-After at once.
func TestRefusedMiddlewareAnswers503AtOnce(t *testing.T) {
	r := testutil.NewRefused(t, 0)
	g, err := guard.New(r.Client(t), guard.WithPrefix(testutil.NewPrefix()), guard.WithRules(funnel.AtMost(1, time.Minute)), guard.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	h := g.Middleware(func(*http.Request) (string, error) { return "k", nil })(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("the handler ran while Redis refused connections")
	}))
	start := time.Now()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if took := time.Since(start); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || took > time.Second {
		t.Fatalf("middleware answered %d (Retry-After %q) after %v; want 503 with Retry-After at once", rec.Code, rec.Header().Get("Retry-After"), took)
	}
}

// A closed client will not come back by itself: denied at once with
// ErrRejected, whatever OnError says.
func TestClosedClientDeniesAtOnce(t *testing.T) {
	b := testutil.Mini(t)
	c := b.Client(t)
	g, err := guard.New(c, guard.WithPrefix(b.Prefix), guard.WithRules(funnel.AtMost(1, time.Minute)), guard.WithOnError(guard.FailOpen), guard.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	for i := range 3 { // and it stays so: the outage watch takes no closed client for a refusing server
		start := time.Now()
		d, err := g.Allow(context.Background(), "k")
		if took := time.Since(start); d.Allowed || !d.Degraded || !errors.Is(err, guard.ErrRejected) || !errors.Is(err, funnel.ErrUnreachable) || took > time.Second {
			t.Fatalf("Allow %d on a closed client: %+v, %v after %v; want a denial with ErrRejected at once", i, d, err, took)
		}
	}
}
