package otelguard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/funnelguard/funnelguard/otelguard"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// An Observer as a guard's WithObserve: each decision counted by
// outcome and the rule that denied.
func ExampleNewObserver() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()

	reader := sdkmetric.NewManualReader() // in production, a periodic reader and an exporter
	obs, _ := otelguard.NewObserver(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	g, _ := guard.New(client,
		guard.WithPrefix("sms:phone:"),
		guard.WithRules(funnel.Window(2, time.Hour)),
		guard.WithObserve(obs.Observe),
	)
	for range 3 {
		_, _ = g.Allow(context.Background(), "+8613800138000")
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != otelguard.MetricDecisions {
			continue
		}
		for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
			outcome, _ := p.Attributes.Value(otelguard.AttrOutcome)
			rule, _ := p.Attributes.Value(otelguard.AttrRule)
			fmt.Printf("%s %q: %d\n", outcome.AsString(), rule.AsString(), p.Value)
		}
	}
	// Unordered output:
	// allowed "": 2
	// denied "2 in 1h0m0s": 1
}

// A traced guard: the Redis commands of the decision are spans under the
// guard's, with redisotel on the same client.
func ExampleTracer_Guard() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()

	spans := tracetest.NewSpanRecorder() // in production, a batch span processor and an exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	_ = redisotel.InstrumentTracing(client, redisotel.WithTracerProvider(tp), redisotel.WithDBStatement(false))
	tr, _ := otelguard.NewTracer(tp, sdkmetric.NewMeterProvider())

	g, _ := guard.New(client, guard.WithPrefix("sms:phone:"), guard.WithRules(funnel.AtMost(1, time.Minute)))
	traced := tr.Guard(g, "sms:phone:")
	_, _ = traced.Do(context.Background(), "+8613800138000", func(ctx context.Context) error {
		return nil // send the code, with ctx: its spans go under the guard's too
	})

	var do sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == otelguard.SpanDo {
			do = s
		}
	}
	fmt.Println(do.Name())
	for _, kv := range do.Attributes() {
		fmt.Printf("  %s=%s\n", kv.Key, kv.Value.Emit())
	}
	under := 0
	for _, s := range spans.Ended() {
		if s.Parent().SpanID() == do.SpanContext().SpanID() && s.Name() == "evalsha" {
			under++
		}
	}
	fmt.Println("EVALSHA spans under it:", under > 0)
	// Output:
	// funnelguard.do
	//   funnelguard.prefix=sms:phone:
	//   funnelguard.n=1
	//   funnelguard.allowed=true
	//   funnelguard.degraded=false
	//   funnelguard.retry_after=0
	// EVALSHA spans under it: true
}

// Tracer.Trace as a guard's WithTrace: a span per decision whatever the
// entry point, here Middleware, under the request's span (otelhttp's in
// production) and over the decision's Redis commands; the handler's work
// stays under the request's span.
func ExampleTracer_Trace() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	_ = redisotel.InstrumentTracing(client, redisotel.WithTracerProvider(tp), redisotel.WithDBStatement(false))
	tr, _ := otelguard.NewTracer(tp, sdkmetric.NewMeterProvider())

	g, _ := guard.New(client, guard.WithPrefix("api:"), guard.WithRules(funnel.Window(100, time.Minute)), guard.WithTrace(tr.Trace))
	h := g.Middleware(guard.Header("X-Api-Key"))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, span := tp.Tracer("app").Start(r.Context(), "handler")
		defer span.End()
		w.WriteHeader(http.StatusNoContent)
	}))

	ctx, request := tp.Tracer("app").Start(context.Background(), "request") // otelhttp.NewHandler's
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	r.Header.Set("X-Api-Key", "key-1")
	h.ServeHTTP(httptest.NewRecorder(), r)
	request.End()

	name := map[trace.SpanID]string{}
	for _, s := range spans.Ended() {
		name[s.SpanContext().SpanID()] = s.Name()
	}
	commands := 0
	for _, s := range spans.Ended() {
		switch p := name[s.Parent().SpanID()]; {
		case s.Name() == otelguard.SpanDecide, s.Name() == "handler":
			fmt.Printf("%s under %s\n", s.Name(), p)
		case p == otelguard.SpanDecide:
			commands++ // EVALSHA, and EVAL the first time
		}
	}
	fmt.Println("Redis commands under funnelguard.decide:", commands > 0)
	// Unordered output:
	// funnelguard.decide under request
	// handler under request
	// Redis commands under funnelguard.decide: true
}

// Lock records how long it waited for the lock in funnelguard.lock.wait.
func ExampleTracer_Lock() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()

	reader := sdkmetric.NewManualReader()
	tr, _ := otelguard.NewTracer(sdktrace.NewTracerProvider(), sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	locker, _ := mutex.New(client)
	lk, err := tr.Lock(context.Background(), locker, "order:42")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lk.Unlock(context.Background())

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		p := m.Data.(metricdata.Histogram[float64]).DataPoints[0]
		outcome, _ := p.Attributes.Value(otelguard.AttrOutcome)
		fmt.Println(m.Name, m.Unit, outcome.AsString(), p.Count)
	}
	// Output:
	// funnelguard.lock.wait s ok 1
}
