package guard

import (
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
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

type fallback struct {
	cfg  Fallback
	mu   sync.Mutex
	keys *forgetful.Map[string, *rate.Limiter]
}

func newFallback(cfg Fallback) *fallback {
	return &fallback{cfg: cfg, keys: forgetful.New[string, *rate.Limiter](cfg.MaxKeys)}
}

// allow takes n tokens for k's stored key if it has them, or says how long
// until it will (an hour for more than Burst: never).
func (f *fallback) allow(k keyed, n int64) (funnel.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lim, ok := f.keys.Get(k.sk)
	if !ok {
		lim = rate.NewLimiter(f.cfg.Limit, f.cfg.Burst)
		f.keys.Put(k.sk, lim)
	}
	now := time.Now()
	switch {
	case n > int64(f.cfg.Burst):
		return funnel.Result{RetryAfter: time.Hour}, nil
	case lim.AllowN(now, int(n)):
		return funnel.Result{Allowed: true}, nil
	}
	r := lim.ReserveN(now, int(n))
	defer r.CancelAt(now)
	return funnel.Result{RetryAfter: max(r.DelayFrom(now), time.Millisecond)}, nil
}
