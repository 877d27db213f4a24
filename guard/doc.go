// Package guard gives an endpoint one call, Allow(ctx, key), that combines
// the funnel limiter and the Redis mutex, configured by options: several rules per
// key decided all or nothing, refunds, a failure mode for when Redis is down,
// hashed keys, and net/http middleware.
//
//	g, err := guard.New(client,
//		guard.WithPrefix("sms:phone:"),
//		guard.WithRules(
//			funnel.AtMost(1, time.Minute),   // cooldown: 60 s between codes
//			funnel.Window(5, time.Hour),     // 5 in any hour
//			funnel.Window(10, 24*time.Hour), // 10 in any 24 h
//		),
//		guard.WithSecret(hmacKey), // phone numbers never sit in Redis in clear text
//	)
//	d, err := g.Do(ctx, phone, send) // send runs only if admitted; refunded if it fails
//
// Build the client with ContextTimeoutEnabled, so that the Timeout
// (WithTimeout) bounds each command in go-redis itself.
//
// When Redis cannot answer within the Timeout, a Guard fails closed by
// default (ErrUnavailable), or decides in this process, never unlimited:
// WithOnError(FailOpen), WithFallback. AllowN gives the whole ladder.
//
// Middleware answers a denial 429 with Retry-After; Enter decides a call
// as Middleware decides a request, for other transports. WithInFlight
// bounds the calls of a key that run at once across the fleet; WithPlans
// decides each key by the rules of its plan.
//
// The package does not log and imports no metrics library: WithObserve's
// func receives every decision, and WithTrace's gives the context a decision's
// Redis commands run in (otelguard's span).
package guard
