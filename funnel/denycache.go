package funnel

import (
	"sync"
	"sync/atomic"
	"time"
)

// MaxDenyCache is the most keys WithDenyCache accepts.
const MaxDenyCache = 1 << 24

// denyCache remembers, per state key, a denial until its gate time
// (WithDenyCache): the latest max keys stored, in nodes linked from the
// oldest stored to the newest, with a map from key to node. An expired
// entry is a miss; nothing runs in the background. Lookups share a read
// lock and allocate nothing. Every method is a no-op on a nil *denyCache.
type denyCache struct {
	max     int
	forgets atomic.Uint64 // the epoch of store

	mu     sync.RWMutex
	index  map[string]int32 // key -> its node
	nodes  []denyNode       // at most max
	oldest int32            // the list of cached keys, -1 when empty
	newest int32
	free   int32 // the forgotten nodes, linked through next; -1 when none
}

// A denyNode is one key's entry in the list, or a free node.
type denyNode struct {
	key        string
	d          denial
	prev, next int32 // -1: none
}

type denial struct {
	set  *ruleSet
	n    int64
	sent time.Time // its waits count from it, on this process's clock
	res  Result
}

func newDenyCache(max int) *denyCache {
	return &denyCache{max: max, index: make(map[string]int32), oldest: -1, newest: -1, free: -1}
}

// lookup returns key's cached denial, its waits counted down, for a call
// of the same set and at least as many units, before its gate time.
func (c *denyCache) lookup(key string, set *ruleSet, n int64) (Result, bool) {
	if c == nil {
		return Result{}, false
	}
	c.mu.RLock()
	i, ok := c.index[key]
	var e denial
	if ok {
		e = c.nodes[i].d
	}
	c.mu.RUnlock()
	if e.set != set || n < e.n { // a miss's zero e has no set
		return Result{}, false
	}
	return e.at(time.Now())
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

// epoch returns the count of forgets so far, taken before a call asks Redis.
func (c *denyCache) epoch() uint64 {
	if c == nil {
		return 0
	}
	return c.forgets.Load()
}

// store makes r, the denial of a call of n units with set for key sent at
// sent, key's entry, unless a forget happened since epoch.
func (c *denyCache) store(key string, set *ruleSet, n int64, sent time.Time, epoch uint64, r Result) {
	if c == nil || r.RetryAfter <= 0 { // an admission's is 0
		return
	}
	e := denial{set: set, n: n, sent: sent, res: r}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Under the lock, as forget counts: a forget is wholly before or after.
	if c.forgets.Load() == epoch {
		c.put(key, e)
	}
}

// put makes e the entry of key, the newest; c.mu is held.
func (c *denyCache) put(key string, e denial) {
	i, ok := c.index[key]
	if ok {
		c.unlink(i)
	} else {
		i = c.node()
		c.index[key] = i
	}
	c.nodes[i] = denyNode{key: key, d: e} // link sets prev and next
	c.link(i)
}

// node returns a node for a new key: a forgotten one, a new one while
// there are fewer than max, else the oldest, evicting its key. c.mu is held.
func (c *denyCache) node() int32 {
	switch {
	case c.free >= 0:
		i := c.free
		c.free = c.nodes[i].next
		return i
	case len(c.nodes) < c.max:
		c.nodes = append(c.nodes, denyNode{})
		return int32(len(c.nodes) - 1)
	}
	i := c.oldest
	delete(c.index, c.nodes[i].key)
	c.unlink(i)
	return i
}

func (c *denyCache) unlink(i int32) {
	p, n := c.nodes[i].prev, c.nodes[i].next
	if p >= 0 {
		c.nodes[p].next = n
	} else {
		c.oldest = n
	}
	if n >= 0 {
		c.nodes[n].prev = p
	} else {
		c.newest = p
	}
}

func (c *denyCache) link(i int32) {
	c.nodes[i].prev, c.nodes[i].next = c.newest, -1
	if c.newest >= 0 {
		c.nodes[c.newest].next = i
	} else {
		c.oldest = i
	}
	c.newest = i
}

// forget drops key's entry: a Refund or Reset may have committed.
func (c *denyCache) forget(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgets.Add(1)
	i, ok := c.index[key]
	if !ok {
		return
	}
	delete(c.index, key)
	c.unlink(i)
	c.nodes[i] = denyNode{next: c.free} // drops the key and the rules
	c.free = i
}
