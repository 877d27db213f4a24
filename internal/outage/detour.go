package outage

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// Detouring reports whether a call begun now should send its commands to
// another client than the watched one (Spare): for Detour after a probe
// found the server back from refusing connections, when the watched
// client's pools may still refuse every new connection (their dial breaker)
// though the server answers. It costs an atomic load while no outage ended.
func (w *Watch) Detouring() bool {
	if w == nil {
		return false
	}
	end := w.detour.Load()
	return end != 0 && time.Now().UnixNano() < end
}

// Spare returns a client of the watched server, made at the first call from
// the watched client's options, for the calls of a detour; nil for a Watch
// made by New. It has pools of its own, whose dial breakers the outage did
// not touch, and none of the watched client's hooks. It starts no
// connection of its own (no MinIdleConns), and keeps at most spareIdle of
// those its calls opened once they are done.
func (w *Watch) Spare() *redis.Client {
	if w == nil || w.opts == nil {
		return nil
	}
	w.spare.once.Do(func() {
		o := *w.opts // what go-redis's own clones copy
		o.MinIdleConns, o.MaxIdleConns = 0, spareIdle
		w.spare.client = redis.NewClient(&o)
	})
	return w.spare.client
}

// spareIdle bounds the idle connections a Spare keeps between detours.
const spareIdle = 4
