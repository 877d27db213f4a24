package guard_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// Bad input beyond guard_test.go and middleware_test.go: key lengths up to
// 10 MiB with a count of the commands sent, user keys that spell the
// guard's own stored forms ("k:", "h:" and "m:" keys), extreme rules and
// policies, bad n, unusable Lockers and ended contexts (which must never be
// taken for an outage, so FailOpen never admits them), on miniredis and on a
// redis-server of the test's own. Each case must give the documented error
// (matched with errors.Is) or behaviour, never panic, and leave no key
// outside the test's prefix or without a TTL.

// guardOn returns a Guard on s with opts, after the prefix s.Prefix (a
// test that sets one starts it with s.Prefix) and a rule of 1 an hour.
func guardOn(t *testing.T, s testutil.Store, opts ...guard.Option) *guard.Guard {
	t.Helper()
	defaults := []guard.Option{guard.WithPrefix(s.Prefix), guard.WithRules(funnel.AtMost(1, time.Hour))}
	g, err := guard.New(s.Client, append(defaults, opts...)...)
	if err != nil {
		t.Fatalf("%s: guard.New: %v", s.Name, err)
	}
	return g
}

// badEntry is one entry point of a Guard, as one signature. ran reports
// whether Do ran its function.
type badEntry struct {
	name string
	call func(ctx context.Context, g *guard.Guard, key string, n int64) (d guard.Decision, ran bool, err error)
}

var badEntries = []badEntry{
	{"Allow", func(ctx context.Context, g *guard.Guard, key string, _ int64) (guard.Decision, bool, error) {
		d, err := g.Allow(ctx, key)
		return d, false, err
	}},
	{"AllowN", func(ctx context.Context, g *guard.Guard, key string, n int64) (guard.Decision, bool, error) {
		d, err := g.AllowN(ctx, key, n)
		return d, false, err
	}},
	{"Peek", func(ctx context.Context, g *guard.Guard, key string, _ int64) (guard.Decision, bool, error) {
		d, err := g.Peek(ctx, key)
		return d, false, err
	}},
	{"Refund", func(ctx context.Context, g *guard.Guard, key string, _ int64) (guard.Decision, bool, error) {
		return guard.Decision{}, false, g.Refund(ctx, key)
	}},
	{"RefundN", func(ctx context.Context, g *guard.Guard, key string, n int64) (guard.Decision, bool, error) {
		return guard.Decision{}, false, g.RefundN(ctx, key, n)
	}},
	{"Do", func(ctx context.Context, g *guard.Guard, key string, _ int64) (guard.Decision, bool, error) {
		ran := false
		d, err := g.Do(ctx, key, func(context.Context) error { ran = true; return nil })
		return d, ran, err
	}},
}

// safeCall runs e and turns a panic into an error.
func safeCall(e badEntry, ctx context.Context, g *guard.Guard, key string, n int64) (d guard.Decision, ran bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return e.call(ctx, g, key, n)
}

// TestBadInputKeyLength: keys of 0, MaxKeyLen+1, 1 MiB and 10 MiB bytes
// are refused by every entry point with ErrInvalidKey, a denial that is not
// Degraded, before any command is sent (Do does not run its function); the
// longest keys, 128 (kept plain), 129, 1 KiB and MaxKeyLen bytes (hashed)
// work, each with a funnel of its own.
func TestBadInputKeyLength(t *testing.T) {
	for _, s := range testutil.Stores(t) {
		ctx := context.Background()
		g := guardOn(t, s, guard.WithOnError(guard.FailOpen))
		for _, n := range []int{0, guard.MaxKeyLen + 1, 1 << 20, 10 << 20} {
			key := strings.Repeat("k", n)
			before := s.Cmds.N.Load()
			for _, e := range badEntries {
				d, ran, err := safeCall(e, ctx, g, key, 1)
				if !errors.Is(err, guard.ErrInvalidKey) || d.Allowed || d.Degraded || ran {
					t.Errorf("%s: %s with a %d-byte key = %+v, ran %v, %.100v; want ErrInvalidKey and a plain denial", s.Name, e.name, n, d, ran, err)
				}
			}
			if sent := s.Cmds.N.Load() - before; sent != 0 {
				t.Errorf("%s: a %d-byte key sent %d commands; want it refused before Redis", s.Name, n, sent)
			}
		}
		for _, n := range []int{128, 129, 1 << 10, guard.MaxKeyLen} {
			key := strings.Repeat("k", n)
			if d, err := g.Allow(ctx, key); err != nil || !d.Allowed {
				t.Errorf("%s: first Allow of a %d-byte key = %+v, %v", s.Name, n, d, err)
			}
			if d, err := g.Allow(ctx, key); err != nil || d.Allowed {
				t.Errorf("%s: second Allow of a %d-byte key = %+v, %v; want denied", s.Name, n, d, err)
			}
		}
		s.CheckKeys(t, "long keys")
	}
}

// TestBadInputStoredFormsDoNotCollide: the guard stores a key as "k:"+key,
// "h:"+SHA-256 of a long key, or "m:"+HMAC with a Secret. User keys that
// spell those forms, including the exact stored form of a long key, and
// guards whose prefixes line up with them, never share a funnel.
func TestBadInputStoredFormsDoNotCollide(t *testing.T) {
	long := strings.Repeat("L", 200)
	sum := sha256.Sum256([]byte(long))
	hashed := "h:" + base64.RawURLEncoding.EncodeToString(sum[:])
	for _, s := range testutil.Stores(t) {
		ctx := context.Background()
		g := guardOn(t, s, guard.WithPrefix(s.Prefix+"g:"))
		gk := guardOn(t, s, guard.WithPrefix(s.Prefix+"g:k:")) // "g:" + "k:" lines up with g's stored form
		gh := guardOn(t, s, guard.WithPrefix(s.Prefix+"g:h:"))
		secret := guardOn(t, s, guard.WithPrefix(s.Prefix+"g:"), guard.WithSecret([]byte("s3cret")))
		keys := []string{"x", "k:x", "h:x", "m:x", "k:", "h:", "m:", ":", "k:k:x", "{k:x}", "k:x}", "}{",
			long, hashed, "k:" + long[:126], strings.Repeat("L", 128), strings.Repeat("L", 129)}
		calls := 0
		for _, k := range keys {
			for _, gd := range []*guard.Guard{g, gk, gh, secret} {
				calls++
				if d, err := gd.Allow(ctx, k); err != nil || !d.Allowed {
					t.Fatalf("%s: first Allow(%.40q) = %+v, %v: another key's funnel leaked in", s.Name, k, d, err)
				}
			}
		}
		for _, k := range keys {
			for _, gd := range []*guard.Guard{g, gk, gh, secret} {
				if d, err := gd.Allow(ctx, k); err != nil || d.Allowed {
					t.Fatalf("%s: second Allow(%.40q) = %+v, %v; want denied", s.Name, k, d, err)
				}
			}
		}
		if n := testutil.CountKeys(ctx, s.Client); n != int64(calls) {
			t.Errorf("%s: %d keys for %d (guard, key) pairs; want one state key each", s.Name, n, calls)
		}
		s.CheckKeys(t, "stored forms")
	}
}

// TestBadInputPolicies: policies New must refuse, with ErrInvalidOption
// (and the funnel's ErrInvalidRule for a bad rule, ErrInvalidOption for a
// bad Funnel option), and extreme ones it
// accepts and then uses without overflow.
func TestBadInputPolicies(t *testing.T) {
	const century = 100 * 365 * 24 * time.Hour
	s := testutil.Stores(t)[1]
	ctx := context.Background()
	ok := []funnel.Rule{funnel.AtMost(1, time.Hour)}
	var cluster *redis.ClusterClient
	// WithReplicaAck needs a client that can hold a connection; never dialled.
	replicated := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer replicated.Close()
	for desc, tc := range map[string]struct {
		client mutex.Client
		opts   []guard.Option
		also   error
	}{
		"typed nil *redis.ClusterClient": {cluster, []guard.Option{guard.WithRules(ok...)}, nil},
		"Per 1ns":                        {s.Client, []guard.Option{guard.WithRules(funnel.Rule{Name: "r", Capacity: 1, Leak: 1, Per: time.Nanosecond})}, funnel.ErrInvalidRule},
		"Capacity MaxInt64":              {s.Client, []guard.Option{guard.WithRules(funnel.Rule{Name: "r", Capacity: math.MaxInt64, Leak: 1, Per: time.Second})}, funnel.ErrInvalidRule},
		"Capacity 732 per 100 years":     {s.Client, []guard.Option{guard.WithRules(funnel.Rule{Name: "r", Capacity: 732, Leak: 1, Per: century})}, funnel.ErrInvalidRule},
		"Timeout -1ns":                   {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithTimeout(-1)}, nil},
		"Timeout MinInt64":               {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithTimeout(math.MinInt64)}, nil},
		"ErrorRetryAfter -1s":            {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithErrorRetryAfter(-time.Second)}, nil},
		"OnError -1":                     {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithOnError(-1)}, nil},
		"Fallback MaxKeys -1":            {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithFallback(guard.Fallback{Limit: 1, Burst: 1, MaxKeys: -1})}, nil},
		"Fallback Burst -1":              {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithFallback(guard.Fallback{Limit: 1, Burst: -1})}, nil},
		"Fallback Limit -Inf":            {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithFallback(guard.Fallback{Limit: rate.Limit(math.Inf(-1)), Burst: 1})}, nil},
		"Fallback Limit NaN":             {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithFallback(guard.Fallback{Limit: rate.Limit(math.NaN()), Burst: 1})}, nil},
		"prefix of 257 bytes":            {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithPrefix(strings.Repeat("p", 257))}, nil},
		"prefix with }":                  {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithPrefix("a}")}, nil},
		"an empty Rule":                  {s.Client, []guard.Option{guard.WithRules(funnel.Rule{})}, funnel.ErrInvalidRule},
		"WithDenyCache(0)":               {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithFunnel(funnel.WithDenyCache(0))}, funnel.ErrInvalidOption},
		"WithLocker(nil)":                {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithFunnel(nil, funnel.WithLocker(nil))}, funnel.ErrInvalidOption},
		"WithLease(0)":                   {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithFunnel(funnel.WithLease(0))}, funnel.ErrInvalidOption},
		"a Penalty of no denials":        {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithFunnel(funnel.WithPenalty(funnel.Penalty{Within: time.Minute, For: time.Minute}))}, funnel.ErrInvalidOption},
		"replica ack as long as Timeout": {replicated, []guard.Option{guard.WithRules(ok...), guard.WithTimeout(time.Second), guard.WithFunnel(funnel.WithReplicaAck(1, time.Second))}, nil},
		"a nil Option":                   {s.Client, []guard.Option{guard.WithRules(ok...), nil}, nil},
		"InFlight -1":                    {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithInFlight(-1)}, nil},
		"InFlight MinInt64":              {s.Client, []guard.Option{guard.WithRules(ok...), guard.WithInFlight(math.MinInt64)}, nil},
	} {
		var g *guard.Guard
		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			g, err = guard.New(tc.client, tc.opts...)
			return err
		}()
		if !errors.Is(err, guard.ErrInvalidOption) || g != nil {
			t.Errorf("New with %s = %v, %v; want ErrInvalidOption", desc, g, err)
		}
		if tc.also != nil && !errors.Is(err, tc.also) {
			t.Errorf("New with %s = %v; want it to match %v too", desc, err, tc.also)
		}
	}

	for desc, p := range map[string][]guard.Option{
		"Timeout MaxInt64":             {guard.WithPrefix(s.Prefix + "t:"), guard.WithTimeout(math.MaxInt64)},
		"ErrorRetryAfter MaxInt64":     {guard.WithPrefix(s.Prefix + "e:"), guard.WithErrorRetryAfter(math.MaxInt64)},
		"Fallback of MaxInt keys":      {guard.WithPrefix(s.Prefix + "f:"), guard.WithFallback(guard.Fallback{Limit: rate.Inf, Burst: math.MaxInt, MaxKeys: math.MaxInt})},
		"rule of 1 per 100 years":      {guard.WithPrefix(s.Prefix + "c:"), guard.WithRules(funnel.Rule{Name: "century", Capacity: 1, Leak: 1, Per: century})},
		"rule with a Lua-looking name": {guard.WithPrefix(s.Prefix + "n:"), guard.WithRules(funnel.Rule{Name: "') redis.call('FLUSHALL') --", Capacity: 1, Leak: 1, Per: time.Hour})},
	} {
		g := guardOn(t, s, p...)
		if d, err := g.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Errorf("%s: first Allow = %+v, %v", desc, d, err)
		}
		if d, err := g.Allow(ctx, "k"); err != nil || d.Allowed || d.RetryAfter <= 0 {
			t.Errorf("%s: second Allow = %+v, %v; want denied with a positive RetryAfter", desc, d, err)
		}
		s.CheckKeys(t, desc)
	}
}

// TestBadInputUnits: n below 1 or above a rule's capacity is the caller's
// error (funnel.ErrInvalidN), not an outage: never Degraded, never admitted
// by FailOpen or a Fallback; RefundN refuses n < 1 and takes MaxInt64.
func TestBadInputUnits(t *testing.T) {
	s := testutil.Stores(t)[0]
	ctx := context.Background()
	for desc, p := range map[string][]guard.Option{
		"FailOpen": {guard.WithPrefix(s.Prefix + "o:"), guard.WithOnError(guard.FailOpen)},
		"Fallback": {guard.WithPrefix(s.Prefix + "f:"), guard.WithFallback(guard.Fallback{Limit: rate.Inf, Burst: 1})},
	} {
		// A Timeout that a loaded machine cannot reach: a call past the
		// default 500 ms would be admitted by the Fallback (degraded), and
		// this test is about units, not outages.
		p = append(p, guard.WithTimeout(time.Minute))
		g := guardOn(t, s, p...)
		if d, err := g.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("%s: Allow = %+v, %v", desc, d, err)
		}
		for _, n := range []int64{0, -1, math.MinInt64, 2, math.MaxInt64} {
			d, err := g.AllowN(ctx, "k", n)
			if !errors.Is(err, funnel.ErrInvalidN) || errors.Is(err, guard.ErrUnavailable) || d.Allowed || d.Degraded {
				t.Errorf("%s: AllowN(%d) = %+v, %v; want ErrInvalidN and a plain denial", desc, n, d, err)
			}
			if err := g.RefundN(ctx, "k", n); n < 1 && (!errors.Is(err, funnel.ErrInvalidN) || errors.Is(err, guard.ErrUnavailable)) {
				t.Errorf("%s: RefundN(%d) = %v, want ErrInvalidN", desc, n, err)
			} else if n >= 1 && err != nil {
				t.Errorf("%s: RefundN(%d) = %v", desc, n, err)
			}
		}
		if d, err := g.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Errorf("%s: Allow after refunds = %+v, %v; want the unit back", desc, d, err)
		}
		if d, err := g.Allow(ctx, "k"); err != nil || d.Allowed {
			t.Errorf("%s: a second Allow after refunds = %+v, %v; want denied: refunds never go below empty", desc, d, err)
		}
	}
	s.CheckKeys(t, "units")
}

// TestBadInputEndedContexts: a caller's ctx that is cancelled or past its
// deadline is not an outage: every entry point returns its error, a plain
// denial (never Degraded), Do does not run its function, and neither
// FailOpen nor a Fallback admits; the middleware answers 503 without
// calling the next handler.
func TestBadInputEndedContexts(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, s := range testutil.Stores(t) {
		for desc, p := range map[string][]guard.Option{
			"FailClosed": {guard.WithPrefix(s.Prefix + "c:")},
			"FailOpen":   {guard.WithPrefix(s.Prefix + "o:"), guard.WithOnError(guard.FailOpen)},
			"Fallback":   {guard.WithPrefix(s.Prefix + "f:"), guard.WithFallback(guard.Fallback{Limit: rate.Inf, Burst: 1})},
		} {
			g := guardOn(t, s, p...)
			for _, ended := range []context.Context{cancelled, expired} {
				for _, e := range badEntries {
					d, ran, err := safeCall(e, ended, g, "k", 1)
					if !errors.Is(err, ended.Err()) || errors.Is(err, guard.ErrUnavailable) || d.Allowed || d.Degraded || ran {
						t.Errorf("%s, %s: %s with an ended ctx = %+v, ran %v, %v; want %v and a plain denial", s.Name, desc, e.name, d, ran, err, ended.Err())
					}
				}
			}
			next := false
			h := g.Middleware(func(*http.Request) (string, error) { return "k", nil })(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { next = true }))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/send", nil).WithContext(cancelled))
			if rec.Code != http.StatusServiceUnavailable || next {
				t.Errorf("%s, %s: middleware with a cancelled request = %d, next called %v; want 503 and no call", s.Name, desc, rec.Code, next)
			}
			if d, err := g.Peek(context.Background(), "k"); err != nil || !d.Allowed {
				t.Errorf("%s, %s: Peek after ended contexts = %+v, %v; want nothing taken", s.Name, desc, d, err)
			}
		}
		s.CheckKeys(t, "ended contexts")
	}
}

// TestBadInputMiddlewareNilKeyFunc: Middleware(nil) answers 500 and never
// calls the next handler, instead of panicking on the first request.
func TestBadInputMiddlewareNilKeyFunc(t *testing.T) {
	s := testutil.Stores(t)[0]
	g := guardOn(t, s)
	next := false
	h := g.Middleware(nil)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { next = true }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/send", nil))
	if rec.Code != http.StatusInternalServerError || next {
		t.Fatalf("Middleware(nil): status %d, next called %v; want 500 and not called", rec.Code, next)
	}
}

// TestBadInputMiddlewareKeys: keys the middleware's keyFunc returns are
// checked like Allow's: empty, over MaxKeyLen or 10 MiB give 400 without a
// call to the next handler or to Redis.
func TestBadInputMiddlewareKeys(t *testing.T) {
	s := testutil.Stores(t)[0]
	g := guardOn(t, s, guard.WithOnError(guard.FailOpen))
	for _, n := range []int{0, guard.MaxKeyLen + 1, 10 << 20} {
		key := strings.Repeat("k", n)
		next := false
		h := g.Middleware(func(*http.Request) (string, error) { return key, nil })(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { next = true }))
		before := s.Cmds.N.Load()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/send", nil))
		if rec.Code != http.StatusBadRequest || next || s.Cmds.N.Load() != before {
			t.Errorf("middleware with a %d-byte key = %d, next %v, %d commands; want 400 before Redis", n, rec.Code, next, s.Cmds.N.Load()-before)
		}
	}
}

// TestBadInputRetryAfterSecondsSmall: zero, negative and sub-second waits
// are at least 1 s, so a client told to wait never retries at once.
func TestBadInputRetryAfterSecondsSmall(t *testing.T) {
	for d, want := range map[time.Duration]int64{math.MinInt64: 1, -time.Hour: 1, -1: 1, 0: 1, 1: 1, time.Second: 1, time.Second + 1: 2} {
		if got := guard.RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// TestBadInputBugRetryAfterOverflow: RetryAfterSeconds adds a second before
// dividing, which overflows for waits within a second of math.MaxInt64: a
// 292-year wait becomes "Retry-After: 1". The RateLimit-Policy window,
// Capacity*Per/Leak computed in time.Duration, overflows for rules that
// drain in more than 292 years (AtMost(3, 100 years)). Fixed: the
// regression test (the window is now the rule's own, funnel.Rule.Quota's).
func TestBadInputBugRetryAfterOverflow(t *testing.T) {
	if got, want := guard.RetryAfterSeconds(math.MaxInt64), int64(math.MaxInt64/int64(time.Second)+1); got != want {
		t.Errorf("RetryAfterSeconds(MaxInt64) = %d, want %d", got, want)
	}
	s := testutil.Stores(t)[1]
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) })
	perMax := time.Duration(math.MaxInt64).Truncate(time.Microsecond)
	g := guardOn(t, s,
		guard.WithPrefix(s.Prefix+"r:"),
		guard.WithRateLimitHeaders(),
		guard.WithRules(funnel.Rule{Name: "max", Capacity: 1, Leak: 1, Per: perMax}, funnel.AtMost(3, 100*365*24*time.Hour)),
	)
	h := g.Middleware(func(*http.Request) (string, error) { return "k", nil })(ok)
	serve := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/send", nil))
		return rec
	}
	// Each rule's own window, in whole seconds, without overflow: the
	// largest whole-second Duration for a Per within a second of the
	// largest, and 100 years.
	first := serve()
	if got, want := first.Header().Get("RateLimit-Policy"), `"max";q=1;w=9223372036, "3/876000h0m0s";q=3;w=3153600000`; got != want {
		t.Errorf("RateLimit-Policy %s, want %s", got, want)
	}
	rec := serve()
	secs, err := strconv.ParseInt(rec.Header().Get("Retry-After"), 10, 64)
	if rec.Code != http.StatusTooManyRequests || err != nil || secs < 290*365*24*3600 {
		t.Errorf("denied by a 292-year rule: %d, Retry-After %q; want 429 and about 292 years in seconds", rec.Code, rec.Header().Get("Retry-After"))
	}
}
