// Package guard gives an endpoint one call, Allow(ctx, key), that combines
// the funnel limiter and the Redis mutex under a Policy: several rules per
// key decided all or nothing, refunds, a failure mode for when Redis is down,
// hashed keys, and net/http middleware.
//
//	g, err := guard.New(client, guard.Policy{
//		Prefix: "sms:phone:",
//		Rules: []funnel.Rule{
//			funnel.AtMost(1, time.Minute),    // cooldown
//			funnel.AtMost(5, time.Hour),
//			funnel.AtMost(10, 24*time.Hour),
//		},
//		Secret: hmacKey, // phone numbers never sit in Redis in clear text
//	})
//	d, err := g.Do(ctx, phone, send) // send runs only if admitted; refunded if it fails
//
// When Redis cannot answer within Policy.Timeout, a Guard fails closed by
// default (an SMS costs money): it denies with RetryAfter and an error
// matching ErrUnavailable. FailOpen admits instead, and a Fallback decides
// with an in-process token bucket per key.
//
// The package does not log and imports no metrics library: Policy.Observe
// receives every decision, its error and latency, for Prometheus or
// OpenTelemetry.
package guard
