package otelguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/otelguard"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func (e *env) tracer(t *testing.T, opts ...otelguard.Option) *otelguard.Tracer {
	t.Helper()
	tr, err := otelguard.NewTracer(e.tp, e.mp, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// children fails unless every span but parents descends from one of
// parents, in its trace, and returns how many direct children each parent
// has. A new connection's setup is left out when it is a trace of its own:
// go-redis dials (redis.dial) in a context of its own, and a connection
// dialed for another caller or for Pub/Sub makes its handshake (HELLO, the
// CLIENT SETINFO pipeline) in that context too; a handshake made for the
// command that needed the connection is that command's child.
func children(t *testing.T, spans []sdktrace.ReadOnlySpan, parents []sdktrace.ReadOnlySpan) map[trace.SpanID]int {
	t.Helper()
	isParent := map[trace.SpanID]bool{}
	for _, p := range parents {
		isParent[p.SpanContext().SpanID()] = true
	}
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	n := map[trace.SpanID]int{}
	for _, s := range spans {
		if isParent[s.Parent().SpanID()] {
			n[s.Parent().SpanID()]++
		}
		root := top(s, byID, isParent)
		switch {
		case isParent[root.SpanContext().SpanID()]:
			if s.SpanContext().TraceID() != root.SpanContext().TraceID() {
				t.Errorf("span %s in trace %s, not the wrapper span's %s", s.Name(), s.SpanContext().TraceID(), root.SpanContext().TraceID())
			}
		case !connectionSetup(root.Name()):
			t.Errorf("span %s (parent %s) is under none of the wrapper's spans", s.Name(), s.Parent().SpanID())
		}
	}
	return n
}

// top returns the first of s and its ancestors that is among isParent, or
// else the farthest recorded one.
func top(s sdktrace.ReadOnlySpan, byID map[trace.SpanID]sdktrace.ReadOnlySpan, isParent map[trace.SpanID]bool) sdktrace.ReadOnlySpan {
	for !isParent[s.SpanContext().SpanID()] {
		p, ok := byID[s.Parent().SpanID()]
		if !ok {
			break
		}
		s = p
	}
	return s
}

// connectionSetup reports whether name is a span of redisotel's for a new
// connection: the dial or its handshake.
func connectionSetup(name string) bool {
	return name == "redis.dial" || name == "hello" || strings.HasPrefix(name, "redis.pipeline client")
}

// named returns the ended spans called name.
func (e *env) named(name string) []sdktrace.ReadOnlySpan {
	var found []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	return found
}

// The spans redisotel starts for the guard's Redis commands are children
// of the guard's span, in its trace; the guard span tells the decision.
func TestAllowSpanParentsRedisCommands(t *testing.T) {
	e := newEnv(t)
	g := e.tracer(t).Guard(e.guard(t, guard.WithPrefix("sms:phone:")), "sms:phone:")
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		d, err := g.AllowN(ctx, phone, 1)
		if err != nil || d.Allowed != want {
			t.Fatalf("call %d: %+v, %v; want allowed %v", i, d, err, want)
		}
	}

	allows := e.named(otelguard.SpanAllow)
	if len(allows) != 3 {
		t.Fatalf("%d spans %s, want 3", len(allows), otelguard.SpanAllow)
	}
	n := children(t, e.spans.Ended(), allows)
	for _, a := range allows {
		if n[a.SpanContext().SpanID()] == 0 {
			t.Errorf("guard span %s has no Redis command span under it", a.SpanContext().SpanID())
		}
		if a.Parent().IsValid() {
			t.Errorf("guard span has a parent %v: the test's context had none", a.Parent())
		}
	}

	deny := allows[2]
	want := map[string]string{"funnelguard.prefix": "sms:phone:", "funnelguard.n": "1", "funnelguard.allowed": "false",
		"funnelguard.rule": twoAnHour.Name, "funnelguard.degraded": "false"}
	a := spanAttrs(deny)
	for k, v := range want {
		if a[k] != v {
			t.Errorf("span attribute %s = %q, want %q", k, a[k], v)
		}
	}
	if a["funnelguard.retry_after"] == "" || a["funnelguard.retry_after"] == "0" {
		t.Errorf("retry_after %q on a denial", a["funnelguard.retry_after"])
	}
	if deny.Status().Code == codes.Error {
		t.Errorf("a denial is no error: status %v", deny.Status())
	}
	if _, ok := spanAttrs(allows[0])["funnelguard.rule"]; ok {
		t.Errorf("an admission's span names a rule: %v", spanAttrs(allows[0]))
	}
}

// Do's span holds the decision's Redis commands and fn's own span; fn's
// failure is the span's error, named by its error.type.
func TestDoSpanParentsCommandsAndFn(t *testing.T) {
	e := newEnv(t)
	g := e.tracer(t).Guard(e.guard(t), "")
	sendFailed := errors.New("provider refused")
	var fnSpan trace.SpanContext
	_, err := g.Do(context.Background(), phone, func(ctx context.Context) error {
		_, span := e.tp.Tracer("test").Start(ctx, "send")
		defer span.End()
		fnSpan = span.SpanContext()
		return sendFailed
	})
	if !errors.Is(err, sendFailed) {
		t.Fatalf("Do: %v, want fn's error", err)
	}
	do := e.spanNamed(t, otelguard.SpanDo)
	n := children(t, e.spans.Ended(), []sdktrace.ReadOnlySpan{do})
	if got := n[do.SpanContext().SpanID()]; got < 3 {
		t.Errorf("%d children of the Do span, want the decision's and the refund's commands and fn's", got)
	}
	if !fnSpan.IsValid() || fnSpan.TraceID() != do.SpanContext().TraceID() {
		t.Errorf("fn's span %v is not in the Do span's trace", fnSpan)
	}
	if do.Status().Code != codes.Error || do.Status().Description != "_OTHER" || spanAttrs(do)["error.type"] != "_OTHER" {
		t.Errorf("Do span status %v, attributes %v; want an error of type _OTHER", do.Status(), spanAttrs(do))
	}
	if got := spanAttrs(do)["funnelguard.prefix"]; got != guard.DefaultPrefix {
		t.Errorf("prefix %q, want the default %q", got, guard.DefaultPrefix)
	}
}

func TestNewTracerNilProvider(t *testing.T) {
	e := newEnv(t)
	if _, err := otelguard.NewTracer(nil, e.mp); !errors.Is(err, otelguard.ErrNilProvider) {
		t.Errorf("NewTracer(nil, mp): %v", err)
	}
	if _, err := otelguard.NewTracer(e.tp, nil); !errors.Is(err, otelguard.ErrNilProvider) {
		t.Errorf("NewTracer(tp, nil): %v", err)
	}
}
