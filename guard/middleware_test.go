package guard_test

import (
	"context"
	"encoding/json"
	"errors"
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

func keyFromHeader(r *http.Request) (string, error) {
	k := r.Header.Get("X-Key")
	if k == "" {
		return "", errors.New("no X-Key")
	}
	return k, nil
}

func serve(h http.Handler, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/send", nil)
	if key != "" {
		req.Header.Set("X-Key", key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestMiddleware(t *testing.T) {
	b := testutil.Mini(t)
	b.Mini.SetTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	g := newGuard(t, b, guard.WithRules(funnel.Rule{Name: "slow", Capacity: 1, Leak: 2, Per: 3 * time.Second}))
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) })
	h := g.Middleware(keyFromHeader)(ok)

	if rec := serve(h, "a"); rec.Code != http.StatusAccepted {
		t.Fatalf("first = %d", rec.Code)
	}
	rec := serve(h, "a")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second = %d, want 429", rec.Code)
	}
	// 1.5 s to wait: Retry-After rounds up to 2, never down to 1 or 0.
	if got := rec.Header().Get("Retry-After"); got != "2" {
		t.Fatalf("Retry-After = %q, want 2", got)
	}
	var body struct {
		Error      string `json:"error"`
		RetryAfter int64  `json:"retry_after"`
	}
	if err := json.NewDecoder(rec.Body).Decode(&body); err != nil || body.RetryAfter != 2 || body.Error == "" {
		t.Fatalf("body = %+v, %v", body, err)
	}
	if rec.Header().Get("RateLimit") != "" || rec.Header().Get("RateLimit-Policy") != "" {
		t.Fatal("RateLimit fields sent without RateLimitHeaders")
	}
	if rec := serve(h, ""); rec.Code != http.StatusBadRequest {
		t.Fatalf("no key = %d, want 400", rec.Code)
	}
	if rec := serve(h, strings.Repeat("k", guard.MaxKeyLen+1)); rec.Code != http.StatusBadRequest {
		t.Fatalf("oversized key = %d, want 400", rec.Code)
	}

	b.Mini.SetError("MASTERDOWN Link with MASTER is down")
	rec = serve(h, "b")
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("Redis down = %d, Retry-After %q; want 503 with Retry-After 1", rec.Code, rec.Header().Get("Retry-After"))
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{{0, 1}, {time.Microsecond, 1}, {time.Second, 1}, {time.Second + 1, 2}, {59*time.Second + 999*time.Millisecond, 60}} {
		if got := guard.RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

func TestRateLimitHeaders(t *testing.T) {
	b := testutil.Mini(t)
	b.Mini.SetTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	g := newGuard(t, b,
		guard.WithRateLimitHeaders(),
		guard.WithRules(
			funnel.Rule{Name: `mi"n`, Capacity: 2, Leak: 1, Per: time.Minute},
			funnel.AtMost(5, time.Hour)),
	)
	h := g.Middleware(keyFromHeader)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	rec := serve(h, "a")
	if got, want := rec.Header().Get("RateLimit-Policy"), `"mi\"n";q=2;w=60, "5/1h0m0s";q=5;w=3600`; got != want {
		t.Fatalf("RateLimit-Policy = %s, want %s", got, want)
	}
	// Each rule's own quota: 2 a minute, 5 an hour (not the time a full
	// funnel takes to drain). t is when the named rule is empty: 60 s, not
	// the hour's reset.
	// pk names the key's partition without telling the key: 9 bytes.
	field := rec.Header().Get("RateLimit")
	item, pk, _ := strings.Cut(field, ";pk=")
	if want := `"mi\"n";r=1;t=60`; item != want || !regexp.MustCompile(`^:[A-Za-z0-9+/]{12}:$`).MatchString(pk) {
		t.Fatalf("RateLimit = %s, want %s;pk=:<12 base64 characters>:", field, want)
	}
	serve(h, "a")
	rec = serve(h, "a")
	if got, want := rec.Header().Get("RateLimit"), `"mi\"n";r=0;t=60;pk=`+pk; rec.Code != 429 || got != want {
		t.Fatalf("denied: %d, RateLimit = %s, want %s", rec.Code, got, want)
	}
	if other := serve(h, "b").Header().Get("RateLimit"); strings.HasSuffix(other, pk) || !strings.Contains(other, ";pk=:") {
		t.Fatalf("RateLimit of another key = %s: want a pk of its own (a's is %s)", other, pk)
	}
}

// Keys are data: braces and separators cannot reach another key's state,
// another guard's namespace, or another slot; a Secret hides the key.
func TestKeysStayInTheirSlot(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		phone := newGuard(t, b, guard.WithPrefix(b.Prefix+"sms:phone:"), guard.WithRules(funnel.AtMost(1, time.Hour)))
		ip := newGuard(t, b, guard.WithPrefix(b.Prefix+"sms:"), guard.WithRules(funnel.AtMost(1, time.Hour)))
		keys := []string{"x", "{x}", "}{", "a{b}c", "phone:x", "k:x", "h:x", strings.Repeat("L", 200), strings.Repeat("L", 201)}
		for _, k := range keys {
			for _, g := range []*guard.Guard{phone, ip} {
				if d, err := g.Allow(ctx, k); err != nil || !d.Allowed {
					t.Fatalf("key %.20q: first call = %+v, %v; another key's state leaked in", k, d, err)
				}
			}
		}
		all, _ := c.Keys(ctx, b.Prefix+"*").Result()
		tags := map[string]bool{}
		for _, k := range all {
			open, close := strings.IndexByte(k, '{'), strings.IndexByte(k, '}')
			if open < 0 || close < open {
				t.Fatalf("key %q has no hash tag", k)
			}
			tags[k[:close]] = true
		}
		if len(tags) != 2*len(keys) {
			t.Fatalf("%d distinct tagged keys for %d keys in 2 guards", len(tags), len(keys))
		}

		secret := newGuard(t, b, guard.WithPrefix(b.Prefix+"hid:"), guard.WithSecret([]byte("s3cret")), guard.WithRules(funnel.AtMost(1, time.Hour)))
		secret.Allow(ctx, "+8613800138000")
		hidden, _ := c.Keys(ctx, b.Prefix+"hid:*").Result()
		for _, k := range hidden {
			if strings.Contains(k, "8613800138000") {
				t.Fatalf("key %q holds the phone number in clear text", k)
			}
		}
		if len(hidden) == 0 {
			t.Fatal("the secret guard wrote no key")
		}
	})
}

func TestNormalize(t *testing.T) {
	b := testutil.Mini(t)
	g := newGuard(t, b,
		guard.WithNormalize(func(k string) (string, error) {
			k = strings.ReplaceAll(k, " ", "")
			if k == "" {
				return "", errors.New("empty number")
			}
			return k, nil
		}),
	)
	ctx := context.Background()
	if d, _ := g.Allow(ctx, "138 0013 8000"); !d.Allowed {
		t.Fatal("first spelling denied")
	}
	if d, _ := g.Allow(ctx, "13800138000"); d.Allowed {
		t.Fatal("a second spelling of the same number got its own bucket")
	}
	if _, err := g.Allow(ctx, "   "); !errors.Is(err, guard.ErrInvalidKey) {
		t.Fatalf("Normalize error = %v, want ErrInvalidKey", err)
	}
}
