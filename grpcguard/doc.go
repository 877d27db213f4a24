// Package grpcguard guards gRPC servers with a guard.Guard: interceptors
// that decide each unary call, and each stream once when it opens, under a
// key derived from the call, before the handler runs.
//
//	g, err := guard.New(client, guard.WithPrefix("sms:grpc:"), guard.WithRules(rules...))
//	ic, err := grpcguard.New(g,
//		grpcguard.WithKey(grpcguard.Metadata("x-api-key")),
//		grpcguard.WithSkip(func(_ context.Context, m string) bool { return strings.HasPrefix(m, "/grpc.health.") }))
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
//
// The key is the peer's address by default (PeerAddr); FullMethod,
// Metadata, PeerAddr behind trusted proxies and Join make others. Calls
// are decided with guard.Guard.Enter, as guard.Guard.Middleware decides
// requests. An admitted call reaches the handler with its guard.Decision
// in the context (FromContext, and guard.FromContext). With
// WithInFlight it holds a permit of its key's semaphore until the
// handler returns (a stream: for its whole life), and the handler's
// context is cancelled if the permit is lost. With WithShadow, denied
// calls reach the handler too, with the denial as their Decision. With
// WithTrace (otelguard.Tracer.Trace), each decision is a span under the
// call's, over the decision's Redis commands; the handler runs in the
// call's context, not under it. A refused call never reaches the handler,
// and ends with:
//
//	what happened                                    code               RetryInfo, retry-after
//	denied by the rules (the default denial); while  ResourceExhausted  yes
//	  Redis cannot answer, by a Fallback or
//	  FailOpen's in-process rules
//	Redis could not answer, failing closed           Unavailable        yes (WithErrorRetryAfter)
//	  (guard.ErrUnavailable); Redis refused the
//	  call (guard.ErrRejected)
//	no InFlight permit in time (guard.ErrBusy)       Unavailable        yes
//	no plan for the key (guard.ErrPlan)              Unavailable        yes
//	the key function failed, the key is invalid      InvalidArgument    no
//	  (guard.ErrInvalidKey), the cost is below 1,
//	  failed or is over a rule's capacity
//	a key function built wrong                       Internal           no
//	  (guard.ErrInvalidKeyFunc), a bad New
//	the call's context ended                         Canceled or        no
//	                                                 DeadlineExceeded
//	anything else                                    Internal           no
//
// RetryInfo is a google.rpc.RetryInfo detail whose retry_delay is the
// Decision's RetryAfter; retry-after is header and trailer metadata
// (RetryAfterKey) in whole seconds, guard.RetryAfterSeconds of it. A status
// message is a fixed text or the Fix of a guard.RequestError: never the
// guard's error, which may name Redis, its keys or the client's input.
//
// ErrBusy is Unavailable, as guard.Guard.Middleware answers it 503: the
// call was admitted by the rules, and only the calls already running keep
// it out; its units are given back, and its RetryInfo is
// WithErrorRetryAfter. Nothing is refunded when a handler fails, as in
// Middleware: a failed attempt counts.
//
// Limiter adapts a Guard to go-grpc-middleware's ratelimit.Limiter.
//
// This package is a module of its own, so that the core module, which
// servers without gRPC import, never carries gRPC in its module graph.
package grpcguard
