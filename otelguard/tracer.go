package otelguard

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Span names.
const (
	SpanAllow   = "funnelguard.allow"
	SpanDo      = "funnelguard.do"
	SpanLock    = "funnelguard.lock"
	SpanAcquire = "funnelguard.semaphore.acquire"
)

// A Tracer starts a span around a guard's decision, a lock's acquisition or
// a semaphore's, and passes the span's context down, so that the spans of
// the Redis commands the call makes (go-redis's redisotel hooks on the same
// client) are its children, and fn's of Do too. A guard.Policy.Observe
// cannot do that: it runs after the decision.
//
// Spans carry the outcome, never the key: see the Attr constants, and
// WithKeyAttributes to add a hash of it. A failed call sets the span's
// status to Error, described by its error.type; the error's text, which may
// quote the key, is not recorded. A Tracer is safe for concurrent use.
type Tracer struct {
	tracer   trace.Tracer
	lockWait metric.Float64Histogram
	semWait  metric.Float64Histogram
	cfg      config
}

// NewTracer returns a Tracer that starts its spans with tp and records the
// wait histograms (MetricLockWait, MetricSemaphoreWait) with mp. A nil
// provider is ErrNilProvider; an instrument mp refuses is its error.
func NewTracer(tp trace.TracerProvider, mp metric.MeterProvider, opts ...Option) (*Tracer, error) {
	if tp == nil || mp == nil {
		return nil, ErrNilProvider
	}
	m := mp.Meter(ScopeName)
	t := &Tracer{tracer: tp.Tracer(ScopeName), cfg: newConfig(opts)}
	var err1, err2 error
	t.lockWait, err1 = m.Float64Histogram(MetricLockWait, metric.WithUnit("s"),
		metric.WithDescription("Time Lock waited for a mutex, by outcome."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	t.semWait, err2 = m.Float64Histogram(MetricSemaphoreWait, metric.WithUnit("s"),
		metric.WithDescription(semaphoreWaitDescription),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return t, nil
}

// start starts the span name for a call on key with attrs, and the
// Tracer's own attributes.
func (t *Tracer) start(ctx context.Context, name, key string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	attrs = append(attrs, t.cfg.attrs...)
	if t.cfg.keyAttrs != nil {
		attrs = append(attrs, t.cfg.keyAttrs(key)...)
	}
	return t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
}

// fail marks span failed by err, if any.
func fail(span trace.Span, err error) {
	if err == nil {
		return
	}
	et := errorType(err)
	span.SetAttributes(AttrErrorType.String(et))
	span.SetStatus(codes.Error, et)
}

// waitOutcome is AttrOutcome of a Lock or Acquire that ended with err.
func waitOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "not_obtained"
	}
	return "error"
}

// endWait ends span, a wait that started at start and ended with err, and
// records it in h.
func (t *Tracer) endWait(ctx context.Context, span trace.Span, h metric.Float64Histogram, start time.Time, err error) {
	wait := time.Since(start).Seconds()
	oc := waitOutcome(err)
	span.SetAttributes(AttrWait.Float64(wait), AttrOutcome.String(oc))
	fail(span, err)
	span.End()
	attrs := append([]attribute.KeyValue{AttrOutcome.String(oc)}, t.cfg.attrs...)
	h.Record(ctx, wait, metric.WithAttributes(attrs...))
}
