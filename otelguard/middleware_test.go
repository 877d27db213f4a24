package otelguard_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/otelguard"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// except returns spans without those called one of names.
func except(spans []sdktrace.ReadOnlySpan, names ...string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if !strings.Contains(","+strings.Join(names, ",")+",", ","+s.Name()+",") {
			out = append(out, s)
		}
	}
	return out
}

// noKey fails the test if a span's attribute holds the key.
func noKey(t *testing.T, spans []sdktrace.ReadOnlySpan) {
	t.Helper()
	for _, s := range spans {
		for k, v := range spanAttrs(s) {
			if strings.Contains(v, phone) {
				t.Errorf("span %s: attribute %s holds the key", s.Name(), k)
			}
		}
	}
}

// With WithTrace set to Tracer.Trace, a guard's Middleware has a span of
// the guard's per request: SpanDecide, a child of the request's span (here
// started by hand, as otelhttp's handler starts it), and the parent of the
// decision's Redis commands (redisotel's spans), with the decision's
// attributes. The handler's own span is the request span's child, not the
// ended decision's. Before WithTrace, the commands were the request
// span's children and Middleware had no span of the guard's.
func TestMiddlewareDecideSpan(t *testing.T) {
	e := newEnv(t)
	tr := e.tracer(t, otelguard.WithKeyAttributes(func(string) []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("test.key_class", "cn")}
	}))
	g := e.guard(t, guard.WithPrefix("api:"), guard.WithTrace(tr.Trace))
	tracer := e.tp.Tracer("test")
	h := g.Middleware(guard.Header("X-Api-Key"))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, span := tracer.Start(r.Context(), "handler")
		span.End()
		w.WriteHeader(http.StatusNoContent)
	}))
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

	requests, decides, handlers := e.named("request"), e.named(otelguard.SpanDecide), e.named("handler")
	if len(requests) != 3 || len(decides) != 3 || len(handlers) != 2 {
		t.Fatalf("%d request spans, %d %s, %d handler spans; want 3, 3, 2", len(requests), len(decides), otelguard.SpanDecide, len(handlers))
	}
	// Every Redis command's span descends from a decision's span, in its
	// trace; each decision has some.
	n := children(t, except(e.spans.Ended(), "request", "handler"), decides)
	for i, d := range decides {
		if n[d.SpanContext().SpanID()] == 0 {
			t.Errorf("decision %d: no Redis command span under it", i)
		}
		req := requests[i]
		if d.Parent().SpanID() != req.SpanContext().SpanID() || d.SpanContext().TraceID() != req.SpanContext().TraceID() {
			t.Errorf("decision %d: parent %v; want request span %v", i, d.Parent().SpanID(), req.SpanContext().SpanID())
		}
	}
	for i, hs := range handlers {
		if hs.Parent().SpanID() != requests[i].SpanContext().SpanID() {
			t.Errorf("handler span %d: parent %v; want its request span %v, not the decision's", i, hs.Parent().SpanID(), requests[i].SpanContext().SpanID())
		}
	}

	want := []map[string]string{
		{"funnelguard.outcome": "allowed", "funnelguard.allowed": "true"},
		{"funnelguard.outcome": "allowed", "funnelguard.allowed": "true"},
		{"funnelguard.outcome": "denied", "funnelguard.allowed": "false", "funnelguard.rule": twoAnHour.Name},
	}
	for i, d := range decides {
		a := spanAttrs(d)
		for k, v := range map[string]string{"funnelguard.prefix": "api:", "funnelguard.n": "1", "funnelguard.degraded": "false",
			"funnelguard.shadow": "false", "test.key_class": "cn"} {
			want[i][k] = v
		}
		for k, v := range want[i] {
			if a[k] != v {
				t.Errorf("decision %d: attribute %s = %q, want %q", i, k, a[k], v)
			}
		}
		if _, ok := a["funnelguard.wait"]; ok {
			t.Errorf("decision %d: a wait without InFlight", i)
		}
		if d.Status().Code == codes.Error {
			t.Errorf("decision %d: status %v; a denial is no error", i, d.Status())
		}
	}
	noKey(t, e.spans.Ended())
	var decisions int64
	for _, p := range counter(t, e.collect(t), "funnelguard.decisions") {
		decisions += p.Value
	}
	if decisions != 3 {
		t.Errorf("%d decisions counted; want 3", decisions)
	}
}

// Enter under WithInFlight: SpanDecide covers the wait for the permit
// (its commands are the span's children, funnelguard.wait its time) and
// ends when Enter returns; the permit's release at Done is the caller's
// span's child. A failed decision (a bad key) is a span with status Error
// and its error.type. Through a Guard of the Tracer too, a call has two
// spans: the wrapper's, and SpanDecide under it.
func TestEnterDecideSpan(t *testing.T) {
	e := newEnv(t)
	tr := e.tracer(t)
	g := e.guard(t, guard.WithPrefix("rpc:"), guard.WithInFlight(1), guard.WithTrace(tr.Trace))
	ctx, call := e.tp.Tracer("test").Start(t.Context(), "call")
	c, err := g.Enter(ctx, phone, 1)
	if err != nil || !c.Admitted() {
		t.Fatalf("Enter: %+v, %v", c, err)
	}
	decided := e.spans.Ended()
	c.Done()
	call.End()

	decide := e.spanNamed(t, otelguard.SpanDecide)
	if decide.Parent().SpanID() != call.SpanContext().SpanID() {
		t.Errorf("decision's parent %v; want the call's span", decide.Parent().SpanID())
	}
	// Before Done: the decision and its commands, the permit's included.
	n := children(t, decided, []sdktrace.ReadOnlySpan{decide})
	if got := n[decide.SpanContext().SpanID()]; got < 2 {
		t.Errorf("%d command spans under the decision; want the admission's and the permit's", got)
	}
	a := spanAttrs(decide)
	if a["funnelguard.outcome"] != "allowed" || a["funnelguard.wait"] == "" || a["funnelguard.prefix"] != "rpc:" {
		t.Errorf("decision attributes %v; want allowed, a permit's wait, prefix rpc:", a)
	}
	// After Done: the release, under the call's span.
	var released int
	for _, s := range e.spans.Ended()[len(decided):] {
		if s.Name() == "call" {
			continue
		}
		released++
		if s.Parent().SpanID() != call.SpanContext().SpanID() {
			t.Errorf("span %s after Done: parent %v; want the call's span", s.Name(), s.Parent().SpanID())
		}
	}
	if released == 0 {
		t.Error("no span of the permit's release")
	}

	e.spans.Reset()
	if _, err := g.Enter(t.Context(), "", 1); !errors.Is(err, guard.ErrInvalidKey) {
		t.Fatalf("Enter with an empty key: %v; want ErrInvalidKey", err)
	}
	bad := e.spanNamed(t, otelguard.SpanDecide)
	if bad.Status().Code != codes.Error || bad.Status().Description != "invalid_key" || spanAttrs(bad)["error.type"] != "invalid_key" ||
		spanAttrs(bad)["funnelguard.outcome"] != "error" {
		t.Errorf("failed decision: status %v, attributes %v; want an error of type invalid_key", bad.Status(), spanAttrs(bad))
	}

	e.spans.Reset()
	if _, err := tr.Guard(g, "rpc:").Allow(t.Context(), phone); err != nil {
		t.Fatal(err)
	}
	allow, decide := e.spanNamed(t, otelguard.SpanAllow), e.spanNamed(t, otelguard.SpanDecide)
	if decide.Parent().SpanID() != allow.SpanContext().SpanID() {
		t.Errorf("through the wrapper: %s's parent %v; want %s's", otelguard.SpanDecide, decide.Parent().SpanID(), otelguard.SpanAllow)
	}
	noKey(t, e.spans.Ended())
}
