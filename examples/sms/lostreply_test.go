package main

import (
	"context"
	"net/http"
	"sync/atomic"
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

// The reply of check.lua is lost after it used the code: go-redis runs it
// again, and the retry must answer as the first run (the code is used, by
// this verification), so the right code verifies, instead of turning into a
// wrong attempt or finding no code and answering 401; a right code costs the
// number no daily failure.
func TestVerifyConsumeReplyLost(t *testing.T) {
	onLostReply(t, nil, func(t *testing.T, e *env, fault *testutil.LostReply, admin *redis.Client) {
		e.want(e.send(number), http.StatusAccepted, "send")
		code := e.sms.code(t, number)
		fault.Drop(testutil.ScriptHash(checkScript.Hash()))
		r := e.verify(number, code)
		fault.ExpectDropped(t, 1)
		e.want(r, http.StatusOK, "verify with the right code, check's reply lost")
		if !r.body.Verified {
			t.Fatalf("verify = %v; want verified", r)
		}
		if got, want := e.failuresLeft(number), e.cfg.MaxDailyFailures; got != want {
			t.Fatalf("daily failures left = %d after a verified code; want %d", got, want)
		}
		e.want(e.verify(number, code), http.StatusUnauthorized, "the used code again")
	})
}

// The reply of check.lua is lost after it counted a wrong guess: the retry
// must not count it again. With 2 attempts per code, a wrong guess and then
// the right code, each with its check's reply lost, leave the right code
// verifying; counted twice, the code would be spent by the first.
func TestVerifyAttemptReplyLost(t *testing.T) {
	opts := []func(*Config){func(c *Config) { c.MaxAttempts = 2 }}
	onLostReply(t, opts, func(t *testing.T, e *env, fault *testutil.LostReply, admin *redis.Client) {
		e.want(e.send(number), http.StatusAccepted, "send")
		code := e.sms.code(t, number)
		check := testutil.ScriptHash(checkScript.Hash())

		fault.Drop(check)
		e.want(e.verify(number, wrong(code, 0)), http.StatusUnauthorized, "a wrong code, check's reply lost")
		fault.ExpectDropped(t, 1)
		n, err := admin.HGet(context.Background(), e.svc.codes.key(number), "a").Int64()
		if err != nil || n != 1 {
			t.Fatalf("attempts counted = %d, %v after one wrong code; want 1", n, err)
		}

		fault.Drop(check)
		r := e.verify(number, code)
		fault.ExpectDropped(t, 2)
		e.want(r, http.StatusOK, "the right code (2nd attempt of 2), check's reply lost")
		if !r.body.Verified {
			t.Fatalf("verify = %v; want verified", r)
		}
		if got, want := e.failuresLeft(number), e.cfg.MaxDailyFailures-1; got != want {
			t.Fatalf("daily failures left = %d; want %d (the wrong code's unit only)", got, want)
		}
	})
}

// The reply of check.lua is lost after the wrong guess that spent the code:
// the retry finds no code, and must still answer "wrong" (the reply kept
// under the verification's nonce), not "no code", or the guess that was
// compared would cost the number no daily failure.
func TestVerifySpendingReplyLost(t *testing.T) {
	opts := []func(*Config){func(c *Config) { c.MaxAttempts = 2 }}
	onLostReply(t, opts, func(t *testing.T, e *env, fault *testutil.LostReply, admin *redis.Client) {
		e.want(e.send(number), http.StatusAccepted, "send")
		code := e.sms.code(t, number)
		e.want(e.verify(number, wrong(code, 0)), http.StatusUnauthorized, "a wrong code")

		fault.Drop(testutil.ScriptHash(checkScript.Hash()))
		e.want(e.verify(number, wrong(code, 1)), http.StatusUnauthorized, "the 2nd wrong code of 2, check's reply lost")
		fault.ExpectDropped(t, 1)
		if m := e.storedMAC(number); m != "" {
			t.Fatal("the code is still stored after its 2nd wrong guess of 2")
		}
		if got, want := e.failuresLeft(number), e.cfg.MaxDailyFailures-2; got != want {
			t.Fatalf("daily failures left = %d; want %d (both wrong codes)", got, want)
		}
		e.want(e.verify(number, code), http.StatusUnauthorized, "the right code of a spent code")
	})
}

// failCheckOnce is a go-redis hook that, once armed, turns the reply of the
// next run of check.lua into an error after Redis ran it: an answer that did
// not come in time, which go-redis does not retry.
type failCheckOnce struct{ armed atomic.Bool }

func (h *failCheckOnce) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failCheckOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *failCheckOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); err == nil && len(args) > 1 && (args[1] == checkScript.Hash() || args[1] == checkSrc) && h.armed.CompareAndSwap(true, false) {
			return context.DeadlineExceeded
		}
		return err
	}
}

// A check whose answer failed after it ran is asked again with the same
// nonce, and answered as it ran: a wrong code costs one failure and one
// attempt, not two, and the right code verifies, instead of a 503 for a code
// that is now used.
func TestVerifyCheckAskedAgain(t *testing.T) {
	e := newEnv(t)
	hook := &failCheckOnce{}
	e.svc.client.AddHook(hook)
	e.want(e.send(number), http.StatusAccepted, "send")
	code := e.sms.code(t, number)

	hook.armed.Store(true)
	e.want(e.verify(number, wrong(code, 0)), http.StatusUnauthorized, "a wrong code, its check failed after it ran")
	if hook.armed.Load() {
		t.Fatal("the fault never fired")
	}
	n, err := e.svc.client.HGet(context.Background(), e.svc.codes.key(number), "a").Int64()
	if err != nil || n != 1 {
		t.Fatalf("attempts counted = %d, %v after one wrong code; want 1", n, err)
	}
	if got, want := e.failuresLeft(number), e.cfg.MaxDailyFailures-1; got != want {
		t.Fatalf("daily failures left = %d; want %d", got, want)
	}

	hook.armed.Store(true)
	r := e.verify(number, code)
	e.want(r, http.StatusOK, "the right code, its check failed after it used the code")
	if hook.armed.Load() {
		t.Fatal("the fault never fired")
	}
	if got, want := e.failuresLeft(number), e.cfg.MaxDailyFailures-1; got != want {
		t.Fatalf("daily failures left = %d; want %d (the wrong code's only)", got, want)
	}
	e.want(e.verify(number, code), http.StatusUnauthorized, "the used code again")
}
