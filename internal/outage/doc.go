// Package outage watches, for one guard, whether Redis refuses connections,
// so that a call made while it does ends at once instead of waiting for the
// client's dial retries (go-redis's defaults spend 0.4 to 1.7 s on a refused
// command) or for its deadline.
//
// A Watch knows only what its calls and probes saw. A probe is one dial
// with the client's own dialer, closed at once, made only while a call runs
// or is admitted during an outage: a Watch has no goroutine of its own.
// Only a refusal (reach.Unreachable) counts: a dial that connects or times
// out is none, and a hung server costs a call its deadline. Once refused,
// only a dial that connects ends the outage, and then, for Detour, calls
// are told to go to a client of their own (Detouring, Spare), which
// go-redis's dial breaker on the watched client cannot hold up.
package outage
