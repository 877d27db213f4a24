package guard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// Answers that will not change fail closed whatever the options say: a
// FailOpen guard, or one with a Fallback, that admitted on them would open
// the limit to whoever can break a key or a permission.
func TestRefusalsFailClosed(t *testing.T) {
	refusals := []string{
		"NOPERM User limited has no permissions to run the 'evalsha' command",
		"OOM command not allowed when used memory > 'maxmemory'.",
		"ERR unknown command 'evalsha', with args beginning with: ",
		"WRONGTYPE Operation against a key holding the wrong kind of value",
		"NOSCRIPT No matching script. Please use EVAL.",
	}
	policies := map[string][]guard.Option{
		"FailOpen":   {guard.WithOnError(guard.FailOpen)},
		"Fallback":   {guard.WithFallback(guard.Fallback{Limit: 100, Burst: 100})},
		"FailClosed": {},
	}
	for name, p := range policies {
		for _, msg := range refusals {
			b := testutil.Mini(t)
			g := newGuard(t, b, p...)
			b.Mini.SetError(msg)
			d, err := g.Allow(context.Background(), "k")
			if d.Allowed || !d.Degraded || !errors.Is(err, guard.ErrRejected) || errors.Is(err, guard.ErrUnavailable) {
				t.Errorf("%s, Redis answering %.30q: %+v, %v; want a denial with ErrRejected", name, msg, d, err)
			}
			rec := httptest.NewRecorder()
			g.Middleware(func(*http.Request) (string, error) { return "k", nil })(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				t.Errorf("%s, Redis answering %.30q: the handler ran", name, msg)
			})).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
			if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
				t.Errorf("%s, Redis answering %.30q: middleware answered %d (Retry-After %q), want 503 with Retry-After", name, msg, rec.Code, rec.Header().Get("Retry-After"))
			}
		}
	}
}

// A corrupt state key (another program wrote a list there) is a refusal
// too, on a real answer rather than an injected one.
func TestCorruptStateFailsClosed(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		g := newGuard(t, b, guard.WithOnError(guard.FailOpen), guard.WithRules(funnel.AtMost(1, time.Hour)))
		if d, err := g.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("first call = %+v, %v", d, err)
		}
		c := b.Client(t)
		keys := testutil.WithoutRecords(c.Keys(ctx, b.Prefix+"*").Val())
		if len(keys) != 1 {
			t.Fatalf("keys %q, want the state key alone", keys)
		}
		c.Del(ctx, keys[0])
		c.RPush(ctx, keys[0], "junk")
		c.Expire(ctx, keys[0], time.Minute)
		for i := range 5 {
			d, err := g.Allow(ctx, "k")
			if d.Allowed || !errors.Is(err, guard.ErrRejected) || !errors.Is(err, funnel.ErrCorruptState) {
				t.Fatalf("call %d on a corrupt state = %+v, %v; want a denial with ErrRejected and ErrCorruptState", i, d, err)
			}
		}
	})
}

// While Redis cannot answer, a FailOpen guard decides with its rules in
// this process: it admits at most what they allow per key, never everyone.
func TestFailOpenIsBounded(t *testing.T) {
	b := testutil.Mini(t)
	rules := []funnel.Rule{funnel.AtMost(1, time.Minute), funnel.AtMost(3, time.Hour)}
	// No retries: go-redis would back off on each LOADING reply.
	g, err := guard.New(b.ClientOpts(t, &redis.Options{MaxRetries: -1}), guard.WithPrefix(b.Prefix), guard.WithOnError(guard.FailOpen), guard.WithRules(rules...))
	if err != nil {
		t.Fatal(err)
	}
	b.Mini.SetError("LOADING Redis is loading the dataset in memory")
	ctx := context.Background()
	admitted := map[string]int{}
	for i := range 300 {
		key := []string{"a", "b", "c"}[i%3]
		d, err := g.Allow(ctx, key)
		if !d.Degraded || !errors.Is(err, guard.ErrUnavailable) {
			t.Fatalf("call %d: %+v, %v; want a degraded decision with ErrUnavailable", i, d, err)
		}
		if d.Allowed {
			admitted[key]++
		} else if d.RetryAfter <= 0 || d.Rule == "" {
			t.Fatalf("call %d: a local denial without RetryAfter or rule: %+v", i, d)
		}
	}
	// In a moment no more than the cooldown's one per key can pass.
	for _, k := range []string{"a", "b", "c"} {
		if admitted[k] != 1 {
			t.Errorf("key %q: %d admitted while Redis was down, want 1 (the cooldown's bound)", k, admitted[k])
		}
	}
	b.Mini.SetError("")
	if d, err := g.Allow(ctx, "a"); err != nil || d.Degraded {
		t.Fatalf("after recovery = %+v, %v", d, err)
	}
}
