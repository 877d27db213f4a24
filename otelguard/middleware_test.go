package otelguard_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/funnelguard/funnelguard/guard"
)

// A Tracer spans Allow, AllowN and Do; a guard's Middleware (and grpcguard's
// interceptors, which decide with Enter as it does) has no span of the
// guard's, and decides in the request's context: the Redis commands of its
// decisions nest under the request's span (here started by hand, as
// otelhttp's handler starts it), in its trace, and the Observer counts the
// decisions. The README says so.
func TestMiddlewareCommandsUnderRequestSpan(t *testing.T) {
	e := newEnv(t)
	g := e.guard(t, guard.Policy{Prefix: "api:"})
	h := g.Middleware(guard.Header("X-Api-Key"))(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	tracer := e.tp.Tracer("test")
	for i, want := range []int{http.StatusNoContent, http.StatusNoContent, http.StatusTooManyRequests} {
		ctx, span := tracer.Start(t.Context(), "request")
		r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
		r.Header.Set("X-Api-Key", phone)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		span.End()
		if rec.Code != want {
			t.Fatalf("request %d: %d; want %d", i, rec.Code, want)
		}
	}
	requests := e.named("request")
	n := children(t, e.spans.Ended(), requests)
	for _, r := range requests {
		if n[r.SpanContext().SpanID()] == 0 {
			t.Errorf("request span %s has no Redis command span under it", r.SpanContext().SpanID())
		}
	}
	if got := len(e.spans.Ended()) - len(requests); got == 0 {
		t.Error("no Redis command spans")
	}
	for _, s := range e.spans.Ended() {
		if s.Name() == "funnelguard.allow" || s.Name() == "funnelguard.do" {
			t.Errorf("span %s: Middleware has no span of the guard's", s.Name())
		}
	}
	var decisions int64
	for _, p := range counter(t, e.collect(t), "funnelguard.decisions") {
		decisions += p.Value
	}
	if decisions != 3 {
		t.Errorf("%d decisions counted; want 3", decisions)
	}
}
