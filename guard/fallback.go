package guard

import (
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/internal/forgetful"
	"golang.org/x/time/rate"
)

// Fallback is a strict in-process limit per key for while Redis is down
// (WithFallback).
type Fallback struct {
	// Limit and Burst are the token bucket of each key (golang.org/x/time/rate).
	Limit rate.Limit
	Burst int
	// MaxKeys bounds the keys remembered (DefaultFallbackMax if zero); when
	// full, the oldest half is forgotten.
	MaxKeys int
}

// fallback is the in-process limiter used while Redis is down: a token
// bucket per key, at most max keys, the oldest half forgotten when full.
type fallback struct {
	cfg  Fallback
	mu   sync.Mutex
	keys *forgetful.Map[string, *rate.Limiter]
}

func newFallback(cfg Fallback) *fallback {
	return &fallback{cfg: cfg, keys: forgetful.New[string, *rate.Limiter](cfg.MaxKeys)}
}

// allow takes n tokens for key if it has them, or says how long until it
// will (an hour for more than Burst: never).
func (f *fallback) allow(key string, n int64) (bool, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lim := f.limiter(key)
	now := time.Now()
	switch {
	case n > int64(f.cfg.Burst):
		return false, time.Hour
	case lim.AllowN(now, int(n)):
		return true, 0
	}
	r := lim.ReserveN(now, int(n))
	defer r.CancelAt(now)
	return false, max(r.DelayFrom(now), time.Millisecond)
}

// limiter is key's bucket, a new one if key has none; f.mu is held.
func (f *fallback) limiter(key string) *rate.Limiter {
	if lim, ok := f.keys.Get(key); ok {
		return lim
	}
	lim := rate.NewLimiter(f.cfg.Limit, f.cfg.Burst)
	f.keys.Put(key, lim)
	return lim
}
