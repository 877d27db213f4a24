package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// stallAttempts is a go-redis hook that holds check.lua's answer until the
// caller's deadline: a Redis that answers just in time.
type stallAttempts struct{}

func (stallAttempts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (stallAttempts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (stallAttempts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); err == nil && len(args) > 1 && (args[1] == checkScript.Hash() || args[1] == checkSrc) {
			if _, ok := ctx.Deadline(); ok {
				<-ctx.Done()
			}
		}
		return err
	}
}

// A wrong code that was compared must count towards the number's daily
// failures, or the service must not answer it as an ordinary wrong code.
// verify ignores the error of failures.Allow, which shares the request's
// Timeout with the check: when Redis is slow (or the failure key's lock is
// contended, as in TestBruteForce with the default Timeout), the guess is
// answered 401 and never counted, and MaxDailyFailures stops holding.
func TestFailuresCountedWhenRedisIsSlow(t *testing.T) {
	b := testutil.Mini(t)
	b.Mini.SetTime(t0)
	client := b.Client(t)
	client.AddHook(stallAttempts{})
	e := newEnvOn(t, client)
	e.b = b
	e.want(e.send(number), http.StatusAccepted, "send")
	code := e.sms.code(t, number)
	// Only the verifications get the short Timeout (verify reads it per
	// request): with it, the send above would have to finish each of its
	// Redis calls within 100 ms on a loaded machine.
	e.svc.cfg.Timeout = 100 * time.Millisecond
	var answered401, answered503 int64
	for i := range int(e.cfg.MaxAttempts) {
		switch r := e.verify(number, wrong(code, i)); r.status {
		case http.StatusUnauthorized:
			answered401++
		case http.StatusServiceUnavailable: // failing closed is fine too
			answered503++
		default:
			t.Fatalf("wrong guess %d = %v", i+1, r)
		}
	}
	res, err := e.svc.failures.Peek(context.Background(), e.svc.codes.key(number), e.cfg.failureRule())
	if err != nil {
		t.Fatal(err)
	}
	// Every 401 took a unit. A 503 may have taken one too (its Redis call
	// can land after the Timeout ended the wait for its reply, on a slow
	// machine): then fewer are left, which counts no guess too few.
	if got, want := res.Remaining, e.cfg.MaxDailyFailures-answered401; got > want || (answered503 == 0 && got != want) {
		t.Fatalf("daily failures left = %d after %d wrong codes answered 401 (%d 503); want %d", got, answered401, answered503, want)
	}
}

// A number with a pending code and one without must answer a run of wrong
// codes alike (DESIGN: responses that don't reveal whether a number is
// known). The 6th wrong code of a pending number is answered 429, that of a
// number without a code 401: six requests tell whether someone asked for a
// code in the last CodeTTL (and void that code).
func TestEnumerationAtAttemptLimit(t *testing.T) {
	e := newEnv(t)
	e.want(e.send(number), http.StatusAccepted, "send")
	code := e.sms.code(t, number)
	statuses := func(phone string) []int {
		var s []int
		for i := range int(e.cfg.MaxAttempts) + 2 {
			s = append(s, e.verify(phone, wrong(code, i)).status)
		}
		return s
	}
	pending, unknown := statuses(number), statuses(phoneN(1))
	if !slices.Equal(pending, unknown) {
		t.Fatalf("wrong codes for a pending number = %v; for an unknown one = %v; want the same", pending, unknown)
	}
}

// Behind a proxy that appends to X-Forwarded-For (nginx
// $proxy_add_x_forwarded_for, cloud load balancers), the leftmost entry is
// whatever the client sent; the address the proxy saw is the rightmost.
// clientIP takes the leftmost, so with -trust-proxy a client that writes its
// own X-Forwarded-For escapes the per-IP limits.
func TestTrustProxySpoofedForwardedFor(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TrustProxy = true })
	for i := range 10 {
		xff := fmt.Sprintf("198.51.100.%d, 203.0.113.7", i)
		e.want(e.send(phoneN(i), "X-Forwarded-For", xff), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
	}
	r := e.send(phoneN(10), "X-Forwarded-For", "198.51.100.99, 203.0.113.7")
	e.want(r, http.StatusTooManyRequests, "the 11th code for the client the proxy saw as 203.0.113.7")
}

// A body over 4 KiB is refused, however it ends. decode stops reading at
// 4 KiB, but dec.More reports false on the read error, so a valid object
// followed by whitespace past the limit is accepted (harmless: nothing past
// 4 KiB is read).
func TestBodyOver4KiBTrailingSpace(t *testing.T) {
	e := newEnv(t)
	r := e.do("POST", "/api/sms/send", `{"phone":"13800138000"}`+strings.Repeat(" ", 5000))
	e.want(r, http.StatusRequestEntityTooLarge, "send of a body over 4 KiB")
}
