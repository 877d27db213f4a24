package funnel

import (
	"container/list"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MaxDenyCache is the most keys WithDenyCache accepts.
const MaxDenyCache = 1 << 24

// denyCache remembers, per key (the caller's, unprefixed), a denial until
// its gate time (WithDenyCache): the latest max keys stored, in a list from
// the oldest stored to the newest. An expired entry is a miss; nothing runs
// in the background. A lookup takes no lock and allocates nothing: entries
// maps each key to its denial, never changed once stored, so cores reading
// one flooded key share it read-only. The Limiter's is nil when off: its
// callers check, so that a call with it off never enters this file.
type denyCache struct {
	max int
	// forgets counts forget's calls: a call reads it (its epoch) before it
	// asks Redis, and store keeps its denial only if it is unchanged.
	forgets atomic.Uint64
	entries sync.Map // key -> *denial, changed only under mu

	mu    sync.Mutex // orders stores and forgets; guards order
	order list.List  // of *denial, the one entries holds, at most max
}

// A denial is one key's entry.
type denial struct {
	key  string
	set  *ruleSet
	n    int64
	sent time.Time // its waits count from it, on this process's clock
	res  Result
	el   *list.Element // its place in order (under mu)
}

func newDenyCache(max int) *denyCache { return &denyCache{max: max} }

// lookup returns key's cached denial, its waits counted down, for a call
// of the same set and at least as many units, before its gate time.
func (c *denyCache) lookup(key string, set *ruleSet, n int64) (Result, bool) {
	if v, ok := c.entries.Load(key); ok {
		if e := v.(*denial); e.set == set && n >= e.n {
			return e.at(time.Now())
		}
	}
	return Result{}, false
}

// at returns e's Result with its waits counted down to now, before its
// gate time.
func (e *denial) at(now time.Time) (Result, bool) {
	res, past := e.res, now.Sub(e.sent)
	if res.RetryAfter <= past {
		return Result{}, false
	}
	res.RetryAfter -= past
	res.ResetAfter = max(res.ResetAfter-past, 0)
	res.TightestReset = max(res.TightestReset-past, 0)
	return res, true
}

// store makes r, the denial of a call of n units with set for key sent at
// sent, key's entry, unless a forget happened since epoch.
func (c *denyCache) store(key string, set *ruleSet, n int64, sent time.Time, epoch uint64, r Result) {
	if r.RetryAfter <= 0 { // an admission's is 0
		return
	}
	e := &denial{key: key, set: set, n: n, sent: sent, res: r}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Under the lock, as forget counts: a forget is wholly before or after.
	if c.forgets.Load() == epoch {
		c.put(e)
	}
}

// put makes e the entry of its key, the newest; a new key past max takes
// the oldest's element. c.mu is held.
func (c *denyCache) put(e *denial) {
	if v, ok := c.entries.Load(e.key); ok {
		old := v.(*denial)
		e.key, e.el = old.key, old.el
		c.order.MoveToBack(e.el)
	} else {
		e.key = strings.Clone(e.key) // not a caller's buffer, kept alive
		if c.order.Len() < c.max {
			e.el = c.order.PushBack(e)
		} else {
			e.el = c.order.Front()
			c.entries.Delete(e.el.Value.(*denial).key)
			c.order.MoveToBack(e.el)
		}
	}
	e.el.Value = e
	c.entries.Store(e.key, e)
}

// forget drops key's entry: a Refund or Reset may have committed.
func (c *denyCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgets.Add(1)
	if v, ok := c.entries.LoadAndDelete(key); ok {
		c.order.Remove(v.(*denial).el)
	}
}
