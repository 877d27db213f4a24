package main

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// On the embedded store (miniredis), which does not say its policy, health
// is ok, and says that the policy is unknown.
func TestHealthMiniredis(t *testing.T) {
	e := newEnv(t)
	r := e.do("GET", "/healthz", nil)
	e.want(r, http.StatusOK, "healthz")
	if r.body.Status != healthOK || len(r.body.Redis) != 1 || r.body.Redis[0].Eviction != evictionUnknown {
		t.Fatalf("healthz = %v; want status ok, one server of unknown eviction", r)
	}
}

// On a real server health reports its eviction settings: an evicting
// policy with a memory limit is "degraded" but 200; one without a limit is
// ok with a note. The start-up log names the server and the fix.
func TestHealthEviction(t *testing.T) {
	srv := testutil.StartServer(t)
	admin := srv.Client(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	e := newEnvOn(t, client)
	for _, tc := range []struct {
		policy, maxmemory string
		status, eviction  string
		note              bool
	}{
		{"noeviction", "0", healthOK, evictionNone, false},
		{"noeviction", "100mb", healthOK, evictionNone, false},
		{"allkeys-lru", "0", healthOK, evictionNone, true},
		{"allkeys-lru", "100mb", healthDegraded, evictionPossible, false},
		{"volatile-ttl", "100mb", healthDegraded, evictionPossible, false},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := admin.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.ConfigSet(ctx, "maxmemory", tc.maxmemory).Err(); err != nil {
			t.Fatal(err)
		}
		cancel()
		what := "healthz with " + tc.policy + ", maxmemory " + tc.maxmemory
		r := e.do("GET", "/healthz", nil)
		e.want(r, http.StatusOK, what)
		if r.body.Status != tc.status || len(r.body.Redis) != 1 {
			t.Fatalf("%s = %v; want status %s, one server", what, r, tc.status)
		}
		s := r.body.Redis[0]
		if s.Eviction != tc.eviction || s.Policy != tc.policy || s.MaxMemory == nil || (s.Note != "") != tc.note {
			t.Errorf("%s = %v; want eviction %s, the policy, the limit, a note: %v", what, r, tc.eviction, tc.note)
		}
		if strings.Contains(r.raw, srv.Addr) {
			t.Errorf("%s = %v names the Redis server", what, r)
		}
	}

	var logs strings.Builder
	logServerCheck(context.Background(), client, slog.New(slog.NewTextHandler(&logs, nil)))
	if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, srv.Addr) ||
		!strings.Contains(out, "maxmemory-policy noeviction") {
		t.Errorf("start-up log = %s; want a warning naming the server and the fix", out)
	}
}
