// Package otelguard reports funnelguard's decisions and waits to
// OpenTelemetry: metrics of a guard's decisions through guard.WithObserve
// (Observer), and spans around a guard's decisions, a lock's and a
// semaphore's acquisitions (Tracer), under which the spans of the Redis
// commands nest.
//
//	obs, err := otelguard.NewObserver(meterProvider)
//	tr, err := otelguard.NewTracer(tracerProvider, meterProvider)
//	_ = redisotel.InstrumentTracing(client, redisotel.WithTracerProvider(tracerProvider))
//	g, err := guard.New(client, guard.WithPrefix("sms:phone:"), guard.WithRules(rules...),
//		guard.WithObserve(obs.Observe), guard.WithTrace(tr.Trace)) // a span funnelguard.decide per decision
//	http.Handle("/send", otelhttp.NewHandler(g.Middleware(keyFunc)(send), "send"))
//
//	traced := tr.Guard(g2, "sms:phone:")  // g2 without WithTrace
//	d, err := traced.Do(ctx, phone, send) // a span with the EVALSHAs and send's spans in it
//
//	lk, err := tr.Lock(ctx, locker, "order:42") // records funnelguard.lock.wait
//
// The metrics, in seconds where they measure time (OpenTelemetry semantic
// conventions): funnelguard.decisions, funnelguard.decision.duration,
// funnelguard.degraded_decisions, funnelguard.fail_open_admissions,
// funnelguard.lock.wait and funnelguard.semaphore.wait (see the Metric
// constants for their attributes).
//
// Tracer.Trace, given to guard.WithTrace, spans every decision of the guard
// whatever its entry point: Allow, AllowN, Do, and guard.Guard.Middleware,
// Enter and grpcguard's interceptors. Its span, SpanDecide, is a child of
// the request's (otelhttp's, otelgrpc's) and the parent of the decision's
// Redis commands, the wait for an InFlight permit included; it ends when
// the decision is known, and the handler runs under the request's span, not
// under it. The wrappers of Guard span Allow, AllowN and Do only, and Do's
// span holds fn too; a guard with WithTrace called through them has two
// spans per call, the wrapper's and SpanDecide under it.
//
// No metric or span carries a key, a lock's name or a semaphore's name (phone
// numbers, addresses), nor an error's text, which may quote one: errors are
// named by error.type. WithKeyAttributes adds an attribute of the caller's
// making, such as a keyed hash, to the spans. The Redis commands' spans are
// go-redis's: redisotel records each command with its arguments, keys
// included, unless made WithDBStatement(false), or the guard stores hashed
// keys (guard.WithSecret).
//
// This package lives in a module of its own, so that the funnelguard module
// does not bring OpenTelemetry to those who do not import it.
package otelguard
