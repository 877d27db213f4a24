// Package otelguard reports funnelguard's decisions and waits to
// OpenTelemetry: metrics of a guard's decisions through guard.Policy.Observe
// (Observer), and spans around a guard's calls, a lock's and a semaphore's
// acquisitions (Tracer), under which the spans of the Redis commands nest.
//
//	obs, err := otelguard.NewObserver(meterProvider)
//	g, err := guard.New(client, guard.Policy{Prefix: "sms:phone:", Rules: rules, Observe: obs.Observe})
//
//	tr, err := otelguard.NewTracer(tracerProvider, meterProvider)
//	_ = redisotel.InstrumentTracing(client, redisotel.WithTracerProvider(tracerProvider))
//	traced := tr.Guard(g, "sms:phone:")
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
// The Tracer spans Allow, AllowN and Do. guard.Guard.Middleware, Enter and
// grpcguard's interceptors have no span of the guard's: they decide in the
// request's context, so the Redis commands of their decisions nest under the
// request's span (otelhttp's, otelgrpc's), and the Observer counts them.
//
// No metric or span carries a key, a lock's name or a semaphore's name (phone
// numbers, addresses), nor an error's text, which may quote one: errors are
// named by error.type. WithKeyAttributes adds an attribute of the caller's
// making, such as a keyed hash, to the spans. The Redis commands' spans are
// go-redis's: redisotel records each command with its arguments, keys
// included, unless made WithDBStatement(false), or the guard stores hashed
// keys (guard.Policy.Secret).
//
// This package lives in a module of its own, so that the funnelguard module
// does not bring OpenTelemetry to those who do not import it.
package otelguard
