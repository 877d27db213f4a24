package otelguard

import (
	"context"

	"github.com/funnelguard/funnelguard/guard"
	"go.opentelemetry.io/otel/trace"
)

// A Guard is a guard.Guard whose calls are traced by a Tracer. Made by
// Tracer.Guard; safe for concurrent use. Tracer.Trace, given to
// guard.WithTrace, spans every decision instead, Middleware's and Enter's
// too; a guard with both has two spans per call, this Guard's and
// SpanDecide under it.
type Guard struct {
	t      *Tracer
	g      *guard.Guard
	prefix string
}

// Guard returns g traced by t. prefix is the guard.WithPrefix g was made with
// (a guard.Guard does not tell its own): the spans' AttrPrefix, as an
// Observer's measurements have it.
func (t *Tracer) Guard(g *guard.Guard, prefix string) *Guard {
	return &Guard{t: t, g: g, prefix: prefixOf(prefix)}
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (g *Guard) Allow(ctx context.Context, key string) (guard.Decision, error) {
	return g.AllowN(ctx, key, 1)
}

// AllowN is guard.Guard.AllowN in a span named SpanAllow, whose context
// the Redis commands get.
func (g *Guard) AllowN(ctx context.Context, key string, n int64) (guard.Decision, error) {
	if ctx == nil { // refused by the guard before anything else
		return g.g.AllowN(ctx, key, n)
	}
	ctx, span := g.start(ctx, SpanAllow, key, n)
	d, err := g.g.AllowN(ctx, key, n)
	end(span, d, err)
	return d, err
}

// Do is guard.Guard.Do in a span named SpanDo, whose context the Redis
// commands and fn get: the span covers the decision, fn, and the refund
// when fn fails. A failure of fn is the span's error too.
func (g *Guard) Do(ctx context.Context, key string, fn func(context.Context) error) (guard.Decision, error) {
	if ctx == nil {
		return g.g.Do(ctx, key, fn)
	}
	ctx, span := g.start(ctx, SpanDo, key, 1)
	d, err := g.g.Do(ctx, key, fn)
	end(span, d, err)
	return d, err
}

func (g *Guard) start(ctx context.Context, name, key string, n int64) (context.Context, trace.Span) {
	return g.t.start(ctx, name, key, AttrPrefix.String(g.prefix), AttrN.Int64(n))
}

// end ends span with the decision d and the call's error err.
func end(span trace.Span, d guard.Decision, err error) {
	span.SetAttributes(AttrAllowed.Bool(d.Allowed), AttrDegraded.Bool(d.Degraded),
		AttrRetryAfter.Float64(d.RetryAfter.Seconds()))
	if d.Rule != "" {
		span.SetAttributes(AttrRule.String(d.Rule))
	}
	fail(span, err)
	span.End()
}
