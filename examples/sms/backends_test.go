package main

import (
	"context"
	"regexp"
	"testing"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// onBackends runs f as two subtests: on a service on a fresh miniredis
// (clock at t0) and on one on a redis-server of its own. The service's keys
// have fixed prefixes, so a server shared with other tests would mix their
// keys. Clients get a pool for 256 requests at once.
func onBackends(t *testing.T, opts []func(*Config), f func(t *testing.T, e *env)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		b := testutil.Mini(t)
		b.Mini.SetTime(t0)
		e := newEnvOn(t, b.ClientOpts(t, &redis.Options{PoolSize: 256}), opts...)
		e.b = b
		f(t, e)
	})
	t.Run("redis", func(t *testing.T) {
		srv := testutil.StartServer(t)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 256})
		t.Cleanup(func() { c.Close() })
		f(t, newEnvOn(t, c, opts...))
	})
}

// keyShape is every key the service may write: one of its prefixes and an
// HMAC (base64url, 43 characters), with the funnel's and the lock's kinds
// (a lock's release record ends in its random token). None holds a byte of
// a request.
var keyShape = regexp.MustCompile(`^(sms:code:[A-Za-z0-9_-]{43}` +
	`|sms:(phone|ip|prefix|budget|vip):\{m:[A-Za-z0-9_-]{43}\}:([a-z]+|record:[0-9a-f]{32})` +
	`|sms:fail:\{sms:code:[A-Za-z0-9_-]{43}\}:([a-z]+|record:[0-9a-f]{32})` +
	`|sms:sent:\{[SM]M[0-9a-fA-F]{32}\}` + // a message sent, by Twilio's sid, for its delivery report
	`|sms:conv:\{[A-Za-z0-9_-]{43}\}:(sends|done|pause)` +
	`|sms:inflight:\{provider\}:sem(:[a-z]+)?` + // the provider's calls in flight (inflight.go)
	`|sms:conv:paused:[A-Za-z0-9_-]{43})$`) // the index of paused prefixes (pauseindex.go): a sorted set of those HMACs

// strayKeys returns the keys of the service's Redis that are not of
// keyShape, and how many keys there are.
func (e *env) strayKeys() (stray []string, n int) {
	e.t.Helper()
	ctx := context.Background()
	iter := e.svc.client.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		n++
		if k := iter.Val(); !keyShape.MatchString(k) {
			stray = append(stray, k)
		}
	}
	if err := iter.Err(); err != nil {
		e.t.Fatalf("SCAN: %v", err)
	}
	return stray, n
}
