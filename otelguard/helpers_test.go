package otelguard_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/otelguard"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// phone is the key of the tests: it must show in no attribute.
const phone = "+8613800138000"

// env is a miniredis, a go-redis client traced by redisotel, and the SDK's
// in-memory metric reader and span recorder.
type env struct {
	mr     *miniredis.Miniredis
	client *redis.Client
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{mr: miniredis.RunT(t), reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	e.client = redis.NewClient(&redis.Options{Addr: e.mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = e.client.Close() })
	e.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	t.Cleanup(func() {
		_ = e.mp.Shutdown(context.Background())
		_ = e.tp.Shutdown(context.Background())
	})
	// Without the statement: its arguments are the stored keys, in clear
	// unless the guard has a secret (guard.WithSecret).
	err := redisotel.InstrumentTracing(e.client, redisotel.WithTracerProvider(e.tp), redisotel.WithDBStatement(false))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// twoAnHour is the rule of most tests: a third call within the hour is denied.
var twoAnHour = funnel.Window(2, time.Hour)

// guard returns a guard on e's client with opts, after defaults of its
// own: twoAnHour, a Timeout of 5 s, and a new Observer's Observe.
func (e *env) guard(t *testing.T, opts ...guard.Option) *guard.Guard {
	t.Helper()
	obs, err := otelguard.NewObserver(e.mp)
	if err != nil {
		t.Fatal(err)
	}
	// A loaded machine is no outage.
	defaults := []guard.Option{guard.WithRules(twoAnHour), guard.WithTimeout(5 * time.Second), guard.WithObserve(obs.Observe)}
	g, err := guard.New(e.client, append(defaults, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func (e *env) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// metric returns the metric name of rm, and fails if it is not there.
func metric(t *testing.T, rm metricdata.ResourceMetrics, name string) metricdata.Metrics {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m
			}
		}
	}
	t.Fatalf("no metric %s", name)
	return metricdata.Metrics{}
}

// hasMetric reports whether rm has points of the metric name.
func hasMetric(rm metricdata.ResourceMetrics, name string) bool {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return true
			}
		}
	}
	return false
}

func counter(t *testing.T, rm metricdata.ResourceMetrics, name string) []metricdata.DataPoint[int64] {
	t.Helper()
	m := metric(t, rm, name)
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok || !sum.IsMonotonic {
		t.Fatalf("%s is a %T, not a monotonic int64 sum", name, m.Data)
	}
	return sum.DataPoints
}

func histogram(t *testing.T, rm metricdata.ResourceMetrics, name string) []metricdata.HistogramDataPoint[float64] {
	t.Helper()
	m := metric(t, rm, name)
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s is a %T, not a float64 histogram", name, m.Data)
	}
	if m.Unit != "s" {
		t.Errorf("%s unit %q, want s", name, m.Unit)
	}
	return h.DataPoints
}

// attrs renders a set as key=value strings, for comparisons and messages.
func attrs(s attribute.Set) map[string]string {
	out := map[string]string{}
	for _, kv := range s.ToSlice() {
		out[string(kv.Key)] = kv.Value.Emit()
	}
	return out
}

// spanNamed returns the ended span called name, and fails unless there is
// exactly one.
func (e *env) spanNamed(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %s, want 1", len(found), name)
	}
	return found[0]
}

func spanAttrs(s sdktrace.ReadOnlySpan) map[string]string {
	return attrs(attribute.NewSet(s.Attributes()...))
}

// waitStarted waits until a span called name has started: the call it
// wraps is then on its way.
func (e *env) waitStarted(t *testing.T, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range e.spans.Started() {
			if s.Name() == name {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no span %s started", name)
}
