// Package outage watches, for one guard, whether Redis refuses connections,
// so that a call made while it does ends at once instead of waiting for the
// client's own dial retries (go-redis's defaults spend 0.4 to 1.7 s on a
// refused command) or for its deadline.
//
// A Watch knows only what its calls and its probes have seen. A probe is one
// dial with the client's own dialer, closed at once; it runs only while a
// call lasts or when a call is admitted while Redis refused: a Watch has no
// goroutine of its own, and the only one that may outlive a call is a probe
// dial already under way, bounded by its time limit.
//
// Only a refusal (reach.Unreachable: refused, no route, a name that does not
// resolve) counts. A dial that connects, or that times out, is not one: a
// hung server may still answer, and costs a call its deadline. Once refused,
// only a dial that connects ends the outage; then, for Detour, the Watch
// tells its calls to go to a client of their own (Detouring, Spare), which
// go-redis's dial breaker on the watched client cannot hold up.
package outage
