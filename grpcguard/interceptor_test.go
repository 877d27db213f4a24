package grpcguard_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/grpcguard"
	"github.com/funnelguard/funnelguard/guard"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Admitted calls reach the handler with the guard's Decision; the call
// past the limit does not, and ends ResourceExhausted with the denial's
// wait as RetryInfo and retry-after.
func TestUnaryLimit(t *testing.T) {
	var o observed
	g := newGuard(t, newBackend(t), perHour(3), &o)
	e, cc := guarded(t, g)
	for left := int64(2); left >= 0; left-- {
		call(t, cc, "Say", "hi").wantAdmitted(t, left)
	}
	r := call(t, cc, "Say", "hi")
	r.wantCode(t, codes.ResourceExhausted)
	d, n := o.last()
	if d.Allowed || d.RetryAfter <= 0 || n != 4 {
		t.Fatalf("guard's decision %+v after %d; want the 4th a denial with a wait", d, n)
	}
	r.wantRetry(t, d.RetryAfter)
	if got := e.calls.Load(); got != 3 {
		t.Fatalf("handler ran %d times; want 3", got)
	}
}

// A stream is decided once, when it opens: the one past the limit ends
// before its handler runs.
func TestStreamRefusedAtOpen(t *testing.T) {
	var o observed
	g := newGuard(t, newBackend(t), perHour(1), &o)
	e, cc := guarded(t, g)
	chat(t, cc).wantAdmitted(t, 0)
	r := chat(t, cc)
	r.wantCode(t, codes.ResourceExhausted)
	d, _ := o.last()
	r.wantRetry(t, d.RetryAfter)
	if got := e.calls.Load(); got != 1 {
		t.Fatalf("stream handler ran %d times; want 1", got)
	}
}

// Skipped calls reach the handler undecided and take nothing.
func TestSkip(t *testing.T) {
	g := newGuard(t, newBackend(t), perHour(1), nil)
	_, cc := guarded(t, g, grpcguard.WithSkip(func(_ context.Context, m string) bool { return m == "/test.Echo/Ping" }))
	for range 3 {
		r := call(t, cc, "Ping", "")
		r.wantCode(t, codes.OK)
		if r.value != "no decision" {
			t.Fatalf("skipped call's handler saw %q; want no decision", r.value)
		}
	}
	call(t, cc, "Say", "").wantAdmitted(t, 0) // the skipped calls took nothing
	call(t, cc, "Say", "").wantCode(t, codes.ResourceExhausted)
}

// WithCost charges a unary call what its request says; a bad cost, or one
// over the limit's capacity, is InvalidArgument and takes nothing.
func TestCost(t *testing.T) {
	g := newGuard(t, newBackend(t), perHour(5), nil)
	cost := func(_ context.Context, _ string, req any) (int64, error) {
		return strconv.ParseInt(req.(interface{ GetValue() string }).GetValue(), 10, 64)
	}
	_, cc := guarded(t, g, grpcguard.WithCost(cost))
	for _, bad := range []string{"x", "0", "-1"} {
		call(t, cc, "Say", bad).wantCode(t, codes.InvalidArgument)
	}
	r := call(t, cc, "Say", "6") // over the capacity: no wait would admit it
	r.wantCode(t, codes.InvalidArgument)
	if want := "the request costs more than the limit allows"; r.st.Message() != want {
		t.Fatalf("message %q; want %q", r.st.Message(), want)
	}
	call(t, cc, "Say", "3").wantAdmitted(t, 2)
	call(t, cc, "Say", "3").wantCode(t, codes.ResourceExhausted)
	call(t, cc, "Say", "2").wantAdmitted(t, 0)
}

// WithStreamCost charges a stream when it opens.
func TestStreamCost(t *testing.T) {
	g := newGuard(t, newBackend(t), perHour(5), nil)
	_, cc := guarded(t, g, grpcguard.WithStreamCost(func(context.Context, string) (int64, error) { return 4, nil }))
	chat(t, cc).wantAdmitted(t, 1)
	chat(t, cc).wantCode(t, codes.ResourceExhausted)
	call(t, cc, "Say", "").wantAdmitted(t, 0) // unary calls still cost 1
}

// Metadata keys each tenant apart; a call without the metadata is
// InvalidArgument, telling what is missing.
func TestMetadataKeysTenants(t *testing.T) {
	g := newGuard(t, newBackend(t), perHour(1), nil)
	_, cc := guarded(t, g, grpcguard.WithKey(grpcguard.Metadata("X-Tenant")))
	call(t, cc, "Say", "", "x-tenant", "a").wantAdmitted(t, 0)
	call(t, cc, "Say", "", "x-tenant", "a").wantCode(t, codes.ResourceExhausted)
	call(t, cc, "Say", "", "x-tenant", "b").wantAdmitted(t, 0)
	chat(t, cc, "x-tenant", "c").wantAdmitted(t, 0)
	r := call(t, cc, "Say", "")
	r.wantCode(t, codes.InvalidArgument)
	if want := `missing metadata "x-tenant"`; r.st.Message() != want {
		t.Fatalf("message %q; want %q", r.st.Message(), want)
	}
}

// FullMethod gives each method a key of its own, shared by all callers.
func TestFullMethodKey(t *testing.T) {
	g := newGuard(t, newBackend(t), perHour(1), nil)
	_, cc := guarded(t, g, grpcguard.WithKey(grpcguard.FullMethod()))
	call(t, cc, "Say", "").wantAdmitted(t, 0)
	call(t, cc, "Say", "").wantCode(t, codes.ResourceExhausted)
	call(t, cc, "Ping", "").wantAdmitted(t, 0)
	chat(t, cc).wantAdmitted(t, 0)
}

// The x-forwarded-for metadata names the client only when the peer is a
// trusted proxy: the test's client, at 127.0.0.1, is one in the first
// server and not in the second, where the metadata it writes is ignored.
func TestForwardedForFromTrustedPeerOnly(t *testing.T) {
	b := newBackend(t)
	const xff = "x-forwarded-for"
	trusting := newGuard(t, b, append(perHour(1), guard.WithPrefix("trusting:")), nil)
	_, cc := guarded(t, trusting, grpcguard.WithKey(grpcguard.PeerAddr(guard.ClientIPConfig{TrustedProxies: prefixes("127.0.0.0/8")})))
	call(t, cc, "Say", "", xff, "203.0.113.7").wantAdmitted(t, 0)
	call(t, cc, "Say", "", xff, "198.51.100.1, 203.0.113.8").wantAdmitted(t, 0)
	call(t, cc, "Say", "", xff, "203.0.113.7").wantCode(t, codes.ResourceExhausted)
	chat(t, cc, xff, "203.0.113.9").wantAdmitted(t, 0)

	untrusting := newGuard(t, b, append(perHour(1), guard.WithPrefix("untrusting:")), nil)
	_, cc = guarded(t, untrusting, grpcguard.WithKey(grpcguard.PeerAddr(guard.ClientIPConfig{TrustedProxies: prefixes("10.0.0.0/8")})))
	call(t, cc, "Say", "", xff, "203.0.113.7").wantAdmitted(t, 0)
	call(t, cc, "Say", "", xff, "203.0.113.8").wantCode(t, codes.ResourceExhausted) // the same peer, whatever it writes
	if keys := b.m.Keys(); !slices.ContainsFunc(keys, func(k string) bool {
		return strings.HasPrefix(k, "untrusting:") && strings.Contains(k, "127.0.0.1")
	}) {
		t.Fatalf("no key of 127.0.0.1 among %q", keys)
	}
}

// The default key is the peer's address.
func TestDefaultKeyIsPeer(t *testing.T) {
	b := newBackend(t)
	g := newGuard(t, b, perHour(1), nil)
	_, cc := guarded(t, g)
	call(t, cc, "Say", "", "x-forwarded-for", "203.0.113.7").wantAdmitted(t, 0)
	call(t, cc, "Say", "", "x-forwarded-for", "203.0.113.8").wantCode(t, codes.ResourceExhausted)
	if !slices.ContainsFunc(b.m.Keys(), func(k string) bool { return strings.Contains(k, "{k:127.0.0.1}") }) {
		t.Fatalf("no key of 127.0.0.1 among %q", b.m.Keys())
	}
}

// With Redis down and failing closed, a call ends Unavailable with the
// policy's ErrorRetryAfter, within the guard's Timeout, and the message
// tells nothing of Redis.
func TestRedisDownFailClosed(t *testing.T) {
	b := newBackend(t)
	const timeout, errorRetry = 2 * time.Second, 3 * time.Second
	g := newGuard(t, b, append(perHour(5), guard.WithTimeout(timeout), guard.WithErrorRetryAfter(errorRetry)), nil)
	e, cc := guarded(t, g)
	call(t, cc, "Say", "").wantAdmitted(t, 4)
	b.m.Close()
	for _, do := range []func() reply{
		func() reply { return call(t, cc, "Say", "") },
		func() reply { return chat(t, cc) },
	} {
		start := time.Now()
		r := do()
		if el := time.Since(start); el >= timeout {
			t.Fatalf("refused after %v; want within the Timeout %v", el, timeout)
		}
		r.wantCode(t, codes.Unavailable)
		r.wantRetry(t, errorRetry)
		if r.st.Message() != "rate limiter unavailable" {
			t.Fatalf("message %q; want the fixed text", r.st.Message())
		}
	}
	if got := e.calls.Load(); got != 1 {
		t.Fatalf("handler ran %d times; want 1", got)
	}
}

// A key that Redis refuses to decide (a corrupt state: ErrRejected) ends
// Unavailable, and the message names neither the error nor the key.
func TestRejectedTellsNothing(t *testing.T) {
	b := newBackend(t)
	g := newGuard(t, b, append(perHour(5), guard.WithPrefix("rej:")), nil)
	_, cc := guarded(t, g, grpcguard.WithKey(grpcguard.Metadata("x-tenant")))
	call(t, cc, "Say", "", "x-tenant", "secret-tenant").wantAdmitted(t, 4)
	for _, k := range b.m.Keys() {
		b.m.Del(k)
		if _, err := b.m.Push(k, "junk"); err != nil { // a list: another program's key
			t.Fatal(err)
		}
	}
	r := call(t, cc, "Say", "", "x-tenant", "secret-tenant")
	r.wantCode(t, codes.Unavailable)
	if msg := r.st.Message(); msg != "rate limiter unavailable" {
		t.Fatalf("message %q; want the fixed text", msg)
	}
}

// A key the guard refuses (empty) is InvalidArgument; a key function built
// wrong is Internal; neither reaches the handler.
func TestBadKeys(t *testing.T) {
	g := newGuard(t, newBackend(t), perHour(5), nil)
	empty := func(context.Context, string) (string, error) { return "", nil }
	e, cc := guarded(t, g, grpcguard.WithKey(empty))
	call(t, cc, "Say", "").wantCode(t, codes.InvalidArgument)
	e2, cc2 := guarded(t, g, grpcguard.WithKey(grpcguard.Join()))
	r := call(t, cc2, "Say", "")
	r.wantCode(t, codes.Internal)
	chat(t, cc2).wantCode(t, codes.Internal)
	if e.calls.Load()+e2.calls.Load() != 0 {
		t.Fatal("a handler ran")
	}
}

// WithDeniedHandler's error ends a denied call; a nil one leaves the
// default.
func TestDeniedHandler(t *testing.T) {
	g := newGuard(t, newBackend(t), perHour(1), nil)
	var seen []guard.Decision
	h := func(_ context.Context, m string, d guard.Decision) error {
		seen = append(seen, d) // the server's handlers run one at a time here
		if m == "/test.Echo/Ping" {
			return nil
		}
		return status.Error(codes.PermissionDenied, "slow down")
	}
	_, cc := guarded(t, g, grpcguard.WithKey(grpcguard.FullMethod()), grpcguard.WithDeniedHandler(h))
	call(t, cc, "Say", "").wantAdmitted(t, 0)
	call(t, cc, "Say", "").wantCode(t, codes.PermissionDenied)
	call(t, cc, "Ping", "").wantAdmitted(t, 0)
	r := call(t, cc, "Ping", "")
	r.wantCode(t, codes.ResourceExhausted)
	if len(seen) != 2 || seen[0].Allowed || seen[0].RetryAfter <= 0 {
		t.Fatalf("denied handler saw %+v; want two denials", seen)
	}
	r.wantRetry(t, seen[1].RetryAfter)
}

// New refuses a nil guard, a nil option, and options of nil functions; the
// shorthand interceptors built so refuse every call with Internal.
func TestNewRefusesNil(t *testing.T) {
	g := newGuard(t, newBackend(t), perHour(5), nil)
	bad := map[string][]grpcguard.Option{
		"nil option":                {nil},
		"WithKey(nil)":              {grpcguard.WithKey(nil)},
		"WithCost(nil)":             {grpcguard.WithCost(nil)},
		"WithStreamCost(nil)":       {grpcguard.WithStreamCost(nil)},
		"WithSkip(nil)":             {grpcguard.WithSkip(nil)},
		"WithDeniedHandler(nil)":    {grpcguard.WithDeniedHandler(nil)},
		"nil after a good option":   {grpcguard.WithKey(grpcguard.FullMethod()), nil},
		"WithKey(nil) after a good": {grpcguard.WithKey(grpcguard.FullMethod()), grpcguard.WithKey(nil)},
	}
	for name, opts := range bad {
		if _, err := grpcguard.New(g, opts...); !errors.Is(err, grpcguard.ErrInvalidConfig) {
			t.Errorf("%s: New error %v; want ErrInvalidConfig", name, err)
		}
	}
	if _, err := grpcguard.New(nil); !errors.Is(err, grpcguard.ErrInvalidConfig) {
		t.Errorf("New(nil) error %v; want ErrInvalidConfig", err)
	}
	e, cc := serve(t, grpc.UnaryInterceptor(grpcguard.UnaryServerInterceptor(nil)),
		grpc.StreamInterceptor(grpcguard.StreamServerInterceptor(g, grpcguard.WithKey(nil))))
	call(t, cc, "Say", "").wantCode(t, codes.Internal)
	chat(t, cc).wantCode(t, codes.Internal)
	if got := e.calls.Load(); got != 0 {
		t.Fatalf("handler ran %d times; want 0", got)
	}
}

// The zero Interceptor refuses calls instead of panicking.
func TestZeroInterceptor(t *testing.T) {
	var ic grpcguard.Interceptor
	e, cc := serve(t, grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	call(t, cc, "Say", "").wantCode(t, codes.Internal)
	chat(t, cc).wantCode(t, codes.Internal)
	if got := e.calls.Load(); got != 0 {
		t.Fatalf("handler ran %d times; want 0", got)
	}
}
