package outage

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// Detouring reports whether a call begun now should go to another client
// (Spare): for Detour after the server came back from refusing, while the
// watched client's dial breaker may still refuse it. One atomic load.
func (w *Watch) Detouring() bool {
	return w != nil && time.Now().UnixNano() < w.detour.Load()
}

// Spare returns a client of the watched server for the calls of a detour,
// made at the first call from the watched client's options, with pools of
// its own and none of its hooks; nil for a Watch made by New.
func (w *Watch) Spare() *redis.Client {
	if w == nil || w.spare == nil {
		return nil
	}
	return w.spare()
}
