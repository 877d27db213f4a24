package otelguard

import (
	"context"
	"errors"

	"github.com/funnelguard/funnelguard/guard"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names.
const (
	// MetricDecisions counts decisions ({decision}), with AttrOutcome,
	// AttrRule, AttrPrefix, AttrDegraded, AttrShadow, AttrPlan (with
	// plans) and, on an error, AttrErrorType.
	MetricDecisions = "funnelguard.decisions"
	// MetricDecisionDuration is the latency of decisions in seconds, with
	// the attributes of MetricDecisions.
	MetricDecisionDuration = "funnelguard.decision.duration"
	// MetricDegraded counts the decisions made without Redis, or denied
	// because Redis refused the call (Decision.Degraded).
	MetricDegraded = "funnelguard.degraded_decisions"
	// MetricFailOpen counts the admissions made without Redis (Degraded and
	// Allowed): FailOpen's rules in this process, or a Fallback.
	MetricFailOpen = "funnelguard.fail_open_admissions"
	// MetricLockWait is how long Tracer.Lock waited, in seconds, with
	// AttrOutcome.
	MetricLockWait = "funnelguard.lock.wait"
	// MetricSemaphoreWait is how long Tracer.Acquire waited, in seconds,
	// with AttrOutcome; and, recorded by an Observer, how long a guard's
	// call admitted under WithInFlight waited for its key's permit
	// (guard.Observation.PermitWait), with AttrOutcome (ok, not_obtained
	// for ErrBusy, error) and AttrPrefix.
	MetricSemaphoreWait = "funnelguard.semaphore.wait"
)

// semaphoreWaitDescription describes MetricSemaphoreWait, which a Tracer
// and an Observer both record: one description, so that the SDK sees one
// instrument.
const semaphoreWaitDescription = "Time waited for semaphore permits (Tracer.Acquire, a guard's InFlight permit), by outcome."

// Explicit bucket boundaries, in seconds: a decision takes one or two round
// trips (well under a millisecond on a LAN) up to its Timeout (guard.WithTimeout); a lock
// or semaphore waits for a holder, seconds or more. The SDK's default
// boundaries (0 to 10000) are for milliseconds.
var (
	decisionBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
	waitBuckets     = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
)

// An Observer records a guard's decisions as OpenTelemetry metrics. Its
// Observe method is the func of guard.WithObserve:
//
//	obs, err := otelguard.NewObserver(meterProvider)
//	g, err := guard.New(client, guard.WithPrefix("sms:phone:"), guard.WithRules(rules...), guard.WithObserve(obs.Observe))
//
// One Observer may serve many guards: each measurement carries its guard's
// Prefix. It is safe for concurrent use.
type Observer struct {
	decisions metric.Int64Counter
	duration  metric.Float64Histogram
	degraded  metric.Int64Counter
	failOpen  metric.Int64Counter
	permit    metric.Float64Histogram
	attrs     []attribute.KeyValue
}

// NewObserver returns an Observer whose instruments come from mp (see the
// Metric constants). A nil mp is ErrNilProvider; an instrument mp refuses is
// its error.
func NewObserver(mp metric.MeterProvider, opts ...Option) (*Observer, error) {
	if mp == nil {
		return nil, ErrNilProvider
	}
	m := mp.Meter(ScopeName)
	o := &Observer{attrs: newConfig(opts).attrs}
	var errs [5]error
	o.decisions, errs[0] = m.Int64Counter(MetricDecisions, metric.WithUnit("{decision}"),
		metric.WithDescription("Rate-limit decisions, by outcome and denying rule."))
	o.duration, errs[1] = m.Float64Histogram(MetricDecisionDuration, metric.WithUnit("s"),
		metric.WithDescription("Latency of rate-limit decisions."),
		metric.WithExplicitBucketBoundaries(decisionBuckets...))
	o.degraded, errs[2] = m.Int64Counter(MetricDegraded, metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions made without Redis, or denied because Redis refused the call."))
	o.failOpen, errs[3] = m.Int64Counter(MetricFailOpen, metric.WithUnit("{decision}"),
		metric.WithDescription("Admissions made without Redis (fail-open or fallback)."))
	o.permit, errs[4] = m.Float64Histogram(MetricSemaphoreWait, metric.WithUnit("s"),
		metric.WithDescription(semaphoreWaitDescription),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return o, nil
}

// Observe records one decision; give it to guard.WithObserve.
//
// The outcome is "allowed" when the Decision allows (a fail-open admission
// too: it is also counted by MetricDegraded and MetricFailOpen), "error" when
// it denies with an error (Redis unavailable or refusing, a bad key, a
// cancelled call), and "denied" when a rule denied.
func (o *Observer) Observe(obs guard.Observation) {
	ctx := context.Background()
	set := metric.WithAttributeSet(attribute.NewSet(o.decisionAttrs(obs)...))
	o.decisions.Add(ctx, 1, set)
	o.duration.Record(ctx, obs.Latency.Seconds(), set)
	if obs.Decision.Degraded {
		o.degraded.Add(ctx, 1, set)
		if obs.Decision.Allowed {
			o.failOpen.Add(ctx, 1, set)
		}
	}
	if obs.Permit {
		out := "ok"
		switch {
		case errors.Is(obs.Err, guard.ErrBusy):
			out = "not_obtained"
		case obs.Err != nil:
			out = "error"
		}
		attrs := append(append(make([]attribute.KeyValue, 0, len(o.attrs)+2), o.attrs...),
			AttrOutcome.String(out), AttrPrefix.String(prefixOf(obs.Prefix)))
		o.permit.Record(ctx, obs.PermitWait.Seconds(), metric.WithAttributes(attrs...))
	}
}

func (o *Observer) decisionAttrs(obs guard.Observation) []attribute.KeyValue {
	attrs := append(make([]attribute.KeyValue, 0, len(o.attrs)+6), o.attrs...)
	attrs = append(attrs,
		AttrOutcome.String(outcome(obs.Decision, obs.Err)),
		AttrRule.String(obs.Decision.Rule),
		AttrPrefix.String(prefixOf(obs.Prefix)),
		AttrDegraded.Bool(obs.Decision.Degraded),
		AttrShadow.Bool(obs.Shadow))
	if obs.Plan != "" {
		attrs = append(attrs, AttrPlan.String(obs.Plan))
	}
	if obs.Err != nil {
		attrs = append(attrs, AttrErrorType.String(errorType(obs.Err)))
	}
	return attrs
}

// outcome is AttrOutcome of a decision (see Observer.Observe).
func outcome(d guard.Decision, err error) string {
	switch {
	case d.Allowed:
		return "allowed"
	case err != nil:
		return "error"
	}
	return "denied"
}
