package grpcguard_test

import (
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/grpcguard"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// go-grpc-middleware's ratelimit interceptors, with Limiter, refuse calls
// past the guard's limit, with retry-after metadata and a message that is
// the fixed text.
func TestLimiterAdapter(t *testing.T) {
	g := newGuard(t, newBackend(t), perHour(2), nil)
	lim := grpcguard.Limiter(g, grpcguard.FullMethod())
	e, cc := serve(t, grpc.UnaryInterceptor(ratelimit.UnaryServerInterceptor(lim)),
		grpc.StreamInterceptor(ratelimit.StreamServerInterceptor(lim)))
	for range 2 {
		r := call(t, cc, "Say", "")
		r.wantCode(t, codes.OK)
		if r.value != "no decision" { // a Limiter cannot change the call's context
			t.Fatalf("the handler found %q; want no decision, as Limiter's doc says", r.value)
		}
	}
	r := call(t, cc, "Say", "")
	r.wantCode(t, codes.ResourceExhausted)
	if !strings.HasSuffix(r.st.Message(), ". too many requests") {
		t.Fatalf("message %q; want ratelimit's, ending with the fixed text", r.st.Message())
	}
	if got := r.header.Get(grpcguard.RetryAfterKey); len(got) != 1 || got[0] == "" {
		t.Fatalf("retry-after %q; want one value", got)
	}
	chat(t, cc).wantCode(t, codes.OK) // another method, another key
	chat(t, cc).wantCode(t, codes.OK)
	chat(t, cc).wantCode(t, codes.ResourceExhausted)
	if got := e.calls.Load(); got != 4 {
		t.Fatalf("handlers ran %d times; want 4", got)
	}
}

// A Limiter without a guard refuses every call; one without a key keys on
// the peer.
func TestLimiterNil(t *testing.T) {
	_, cc := serve(t, grpc.UnaryInterceptor(ratelimit.UnaryServerInterceptor(grpcguard.Limiter(nil, nil))))
	call(t, cc, "Say", "").wantCode(t, codes.ResourceExhausted)

	g := newGuard(t, newBackend(t), perHour(1), nil)
	_, cc = serve(t, grpc.UnaryInterceptor(ratelimit.UnaryServerInterceptor(grpcguard.Limiter(g, nil))))
	call(t, cc, "Say", "").wantCode(t, codes.OK)
	call(t, cc, "Ping", "").wantCode(t, codes.ResourceExhausted) // the same peer
}
