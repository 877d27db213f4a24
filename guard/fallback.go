package guard

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// fallback is the in-process limiter used while Redis is down: a token
// bucket per key, at most max keys, the oldest half forgotten when full.
type fallback struct {
	cfg   Fallback
	mu    sync.Mutex
	keys  map[string]*rate.Limiter
	order []string // insertion order, for forgetting
}

func newFallback(cfg Fallback) *fallback {
	return &fallback{cfg: cfg, keys: make(map[string]*rate.Limiter)}
}

// allow takes n tokens for key if it has them, or says how long until it will.
func (f *fallback) allow(key string, n int64) (bool, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lim := f.limiter(key)
	now := time.Now()
	if n > int64(f.cfg.Burst) {
		return false, time.Hour // can never fit; deny
	}
	if lim.AllowN(now, int(n)) {
		return true, 0
	}
	r := lim.ReserveN(now, int(n))
	wait := r.DelayFrom(now)
	r.CancelAt(now)
	return false, max(wait, time.Millisecond)
}

// limiter is key's bucket, a new one if key has none; f.mu is held.
func (f *fallback) limiter(key string) *rate.Limiter {
	if lim, ok := f.keys[key]; ok {
		return lim
	}
	if len(f.keys) >= f.cfg.MaxKeys {
		f.forgetOldest()
	}
	lim := rate.NewLimiter(f.cfg.Limit, f.cfg.Burst)
	f.keys[key] = lim
	f.order = append(f.order, key)
	return lim
}

// forgetOldest forgets the oldest half of the keys; f.mu is held.
func (f *fallback) forgetOldest() {
	half := max(len(f.order)/2, 1)
	for _, k := range f.order[:half] {
		delete(f.keys, k)
	}
	f.order = append(f.order[:0:0], f.order[half:]...)
}
