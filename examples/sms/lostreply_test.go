package main

import (
	"context"
	"net/http"
	"testing"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// onLostReply runs f as two subtests, like onBackends, on a service whose
// client reaches Redis through a lost-reply fault, with go-redis's default
// options but for ContextTimeoutEnabled (as main.go sets it); admin reaches
// the same Redis directly.
func onLostReply(t *testing.T, opts []func(*Config), f func(t *testing.T, e *env, fault *testutil.LostReply, admin *redis.Client)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		b := testutil.Mini(t)
		b.Mini.SetTime(t0)
		c, fault := b.LostReplyClient(t, &redis.Options{ContextTimeoutEnabled: true})
		e := newEnvOn(t, c, opts...)
		e.b = b
		f(t, e, fault, b.Client(t))
	})
	t.Run("redis", func(t *testing.T) {
		srv := testutil.StartServer(t)
		fault := testutil.NewLostReply(t)
		o := fault.Options(srv.Addr)
		o.ContextTimeoutEnabled = true
		c := redis.NewClient(o)
		t.Cleanup(func() { c.Close() })
		f(t, newEnvOn(t, c, opts...), fault, srv.Client(t))
	})
}

// failuresLeft returns how many failed verifications the number may still
// make today.
func (e *env) failuresLeft(phone string) int64 {
	e.t.Helper()
	res, err := e.svc.failures.Peek(context.Background(), e.svc.codes.key(phone), e.cfg.failureRule())
	if err != nil {
		e.t.Fatal(err)
	}
	return res.Remaining
}

// The reply of consume.lua is lost after it used the code: go-redis runs it
// again, and the retry must still answer "used by you", so the right code
// verifies (and its failure unit is given back), instead of burning the
// code and answering 401.
func TestVerifyConsumeReplyLost(t *testing.T) {
	onLostReply(t, nil, func(t *testing.T, e *env, fault *testutil.LostReply, admin *redis.Client) {
		e.want(e.send(number), http.StatusAccepted, "send")
		code := e.sms.code(t, number)
		fault.Drop(testutil.ScriptHash(consumeScript.Hash()))
		r := e.verify(number, code)
		fault.ExpectDropped(t, 1)
		e.want(r, http.StatusOK, "verify with the right code, consume's reply lost")
		if !r.body.Verified {
			t.Fatalf("verify = %v; want verified", r)
		}
		if got, want := e.failuresLeft(number), e.cfg.MaxDailyFailures; got != want {
			t.Fatalf("daily failures left = %d after a verified code; want %d (its unit given back)", got, want)
		}
		e.want(e.verify(number, code), http.StatusUnauthorized, "the used code again")
	})
}

// The reply of attempt.lua is lost after it counted the attempt: the retry
// must not count it again. With 2 attempts per code, a wrong guess and then
// the right code, each with its attempt's reply lost, leave the right code
// verifying; counted twice, the code would be gone after the first.
func TestVerifyAttemptReplyLost(t *testing.T) {
	opts := []func(*Config){func(c *Config) { c.MaxAttempts = 2 }}
	onLostReply(t, opts, func(t *testing.T, e *env, fault *testutil.LostReply, admin *redis.Client) {
		e.want(e.send(number), http.StatusAccepted, "send")
		code := e.sms.code(t, number)
		attempt := testutil.ScriptHash(attemptScript.Hash())

		fault.Drop(attempt)
		e.want(e.verify(number, wrong(code, 0)), http.StatusUnauthorized, "a wrong code, attempt's reply lost")
		fault.ExpectDropped(t, 1)
		n, err := admin.HGet(context.Background(), e.svc.codes.key(number), "a").Int64()
		if err != nil || n != 1 {
			t.Fatalf("attempts counted = %d, %v after one wrong code; want 1", n, err)
		}

		fault.Drop(attempt)
		r := e.verify(number, code)
		fault.ExpectDropped(t, 2)
		e.want(r, http.StatusOK, "the right code (2nd attempt of 2), attempt's reply lost")
		if !r.body.Verified {
			t.Fatalf("verify = %v; want verified", r)
		}
		if got, want := e.failuresLeft(number), e.cfg.MaxDailyFailures-1; got != want {
			t.Fatalf("daily failures left = %d; want %d (the wrong code's unit only)", got, want)
		}
	})
}
