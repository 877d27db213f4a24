package otelguard

import (
	"context"
	"errors"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/mutex"
	"go.opentelemetry.io/otel/attribute"
)

// ScopeName is the instrumentation scope of the meters and tracers this
// package asks its providers for.
const ScopeName = "github.com/funnelguard/funnelguard/otelguard"

// ErrNilProvider is the error of NewObserver and NewTracer given a nil
// provider. Pass otel.GetMeterProvider() or otel.GetTracerProvider() for the
// global ones, or a noop provider to turn the telemetry off.
var ErrNilProvider = errors.New("otelguard: nil provider")

// Attribute keys of the metrics and spans. None of them holds a key, a lock's
// name or a semaphore's name: those are phone numbers, addresses, user ids.
const (
	// AttrOutcome is "allowed", "denied" or "error" on a decision (see
	// Observer), and "ok", "not_obtained" or "error" on a lock or semaphore
	// wait.
	AttrOutcome = attribute.Key("funnelguard.outcome")
	// AttrRule is Decision.Rule, the name of the rule that denied: empty
	// when allowed or when no rule decided (Redis unavailable and failing
	// closed). A span has it only when it is not empty.
	AttrRule = attribute.Key("funnelguard.rule")
	// AttrPrefix is the guard's prefix (guard.DefaultPrefix when
	// guard.WithPrefix left it empty or was not given).
	AttrPrefix = attribute.Key("funnelguard.prefix")
	// AttrPlan is Observation.Plan: the key's plan (guard.WithPlans), on
	// decisions of a guard with plans only.
	AttrPlan = attribute.Key("funnelguard.plan")
	// AttrDegraded is Decision.Degraded: decided without Redis.
	AttrDegraded = attribute.Key("funnelguard.degraded")
	// AttrShadow is Observation.Shadow: the guard blocks nothing
	// (guard.WithShadow).
	AttrShadow = attribute.Key("funnelguard.shadow")
	// AttrN is the units a call asked for, or the permits of an Acquire.
	AttrN = attribute.Key("funnelguard.n")
	// AttrAllowed is Decision.Allowed.
	AttrAllowed = attribute.Key("funnelguard.allowed")
	// AttrRetryAfter is Decision.RetryAfter in seconds.
	AttrRetryAfter = attribute.Key("funnelguard.retry_after")
	// AttrWait is how long a Lock or Acquire waited, in seconds; on a
	// SpanDecide, how long the call waited for its InFlight permit
	// (guard.Observation.PermitWait).
	AttrWait = attribute.Key("funnelguard.wait")
	// AttrSize is the size of a semaphore.
	AttrSize = attribute.Key("funnelguard.semaphore.size")
	// AttrErrorType is the OpenTelemetry error.type of a call that returned
	// an error: the name of the sentinel it matches ("unavailable",
	// "rejected", "busy", "invalid_key", "invalid", "not_obtained",
	// "deadline_exceeded", "canceled"), else "_OTHER". Never the error's
	// text, which may quote the key.
	AttrErrorType = attribute.Key("error.type")
)

// An Option configures NewObserver or NewTracer.
type Option func(*config)

type config struct {
	attrs    []attribute.KeyValue
	keyAttrs func(key string) []attribute.KeyValue
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithAttributes adds attrs to every measurement and span, such as the
// endpoint a guard protects when several share a Prefix.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, attrs...) }
}

// WithKeyAttributes makes a Tracer add f(key) to each span it starts: the
// key of Allow, AllowN and Do, and of a decision of Trace (the caller's
// key, before Normalize), the name of Lock, the Semaphore's name of
// Acquire. It is off by default, and f sees the key in clear: return a
// keyed hash (HMAC with a secret of yours) or a coarse class (the country of
// a phone number), never the key itself, which spans carry to whoever reads
// the traces. Metrics never get it (an Observation has no key, and one
// series per key would be unbounded); NewObserver ignores it.
func WithKeyAttributes(f func(key string) []attribute.KeyValue) Option {
	return func(c *config) { c.keyAttrs = f }
}

// errorTypes name the errors a call can end with, in the order they are
// matched: a guard's sentinels wrap the causes further down the list.
var errorTypes = []struct {
	err  error
	name string
}{
	{guard.ErrUnavailable, "unavailable"},
	{guard.ErrRejected, "rejected"},
	{guard.ErrBusy, "busy"},
	{guard.ErrPlan, "no_plan"},
	{guard.ErrInvalidKey, "invalid_key"},
	{mutex.ErrInvalid, "invalid"},
	{mutex.ErrNotObtained, "not_obtained"},
	{context.DeadlineExceeded, "deadline_exceeded"},
	{context.Canceled, "canceled"},
}

// errorType returns the error.type of err: the name of the first sentinel
// it matches, or "_OTHER" (the OpenTelemetry fallback). Never err.Error():
// an error's text may quote the key.
func errorType(err error) string {
	for _, e := range errorTypes {
		if errors.Is(err, e.err) {
			return e.name
		}
	}
	return "_OTHER"
}

// prefixOf returns the prefix a guard made with guard.WithPrefix(p) uses.
func prefixOf(p string) string {
	if p == "" {
		return guard.DefaultPrefix
	}
	return p
}
