package otelguard

import (
	"context"
	"errors"
	"time"

	"github.com/funnelguard/funnelguard/guard"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Span names.
const (
	// SpanAllow is the span of Guard.Allow and Guard.AllowN.
	SpanAllow = "funnelguard.allow"
	// SpanDo is the span of Guard.Do: the decision, fn and its refund.
	SpanDo = "funnelguard.do"
	// SpanDecide is the span of Tracer.Trace: one decision of a guard,
	// whatever its entry point (Allow, AllowN, Do, Enter, Middleware,
	// grpcguard's interceptors), up to its InFlight permit.
	SpanDecide = "funnelguard.decide"
	// SpanLock is the span of Tracer.Lock.
	SpanLock = "funnelguard.lock"
	// SpanAcquire is the span of Tracer.Acquire.
	SpanAcquire = "funnelguard.semaphore.acquire"
)

// A Tracer starts a span around a guard's decision (Trace, as
// guard.WithTrace, for every entry point; or the wrappers of Guard), a
// lock's acquisition or a semaphore's, and passes the span's context down,
// so that the spans of the Redis commands the call makes (go-redis's
// redisotel hooks on the same client) are its children, and fn's of the
// wrapper's Do too. A guard.WithObserve func cannot do that: it runs after
// the decision.
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

// Trace starts a span named SpanDecide for one decision of a guard, and
// returns its context and the func that ends it; give it to
// guard.WithTrace:
//
//	tr, err := otelguard.NewTracer(tracerProvider, meterProvider)
//	g, err := guard.New(client, guard.WithPrefix("sms:phone:"), guard.WithRules(rules...), guard.WithTrace(tr.Trace))
//	http.Handle("/send", otelhttp.NewHandler(g.Middleware(keyFunc)(send), "send"))
//
// The guard calls it at the start of every decision, whatever the entry
// point: Allow, AllowN, Do, and Enter, Middleware and grpcguard's
// interceptors, which the wrappers of Guard cannot reach. The span is a
// child of the caller's (otelhttp's, otelgrpc's request span), and the
// parent of the decision's Redis commands (redisotel's spans) and of its
// wait for an InFlight permit; it ends once the decision and the permit
// are known, with the attributes of the Observation: AttrPrefix, AttrN,
// AttrOutcome, AttrAllowed, AttrDegraded, AttrShadow, AttrRetryAfter,
// AttrRule and AttrPlan when not empty, AttrWait for the permit's wait,
// and on an error AttrErrorType with status Error (a fail-open admission
// included, as in the wrappers' spans); WithKeyAttributes' attributes of
// the key, never the key. The handler (Middleware, the interceptors), fn
// of Do and the release of the permit are not in it: they run in the
// caller's context, under the request's span.
//
// A guard traced by Trace and called through a Guard of this Tracer has
// two spans per call: the wrapper's SpanAllow or SpanDo, and SpanDecide
// under it. Use one or the other: Trace alone covers every entry point.
func (t *Tracer) Trace(ctx context.Context, key string) (context.Context, func(guard.Observation)) {
	ctx, span := t.start(ctx, SpanDecide, key)
	return ctx, func(o guard.Observation) { endDecide(span, o) }
}

// endDecide ends span, the SpanDecide of the decision o.
func endDecide(span trace.Span, o guard.Observation) {
	d := o.Decision
	span.SetAttributes(AttrPrefix.String(prefixOf(o.Prefix)), AttrN.Int64(o.N),
		AttrOutcome.String(outcome(d, o.Err)), AttrShadow.Bool(o.Shadow))
	if o.Plan != "" {
		span.SetAttributes(AttrPlan.String(o.Plan))
	}
	if o.Permit {
		span.SetAttributes(AttrWait.Float64(o.PermitWait.Seconds()))
	}
	end(span, d, o.Err)
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
