package funnel

import "sync"

// DefaultStateCache is how many keys' state a Limiter remembers by default
// (WithStateCache).
const DefaultStateCache = 1 << 14

// MaxStateCache is the most keys WithStateCache accepts.
const MaxStateCache = 1 << 24

// A stateCache remembers, per state key, the values of its rules' fields as
// this Limiter last saw them: read, or written by itself. A call of the same
// rules on that key then goes to returning.lua, which admits it in one round
// trip if Redis holds those very values. An entry needs no invalidation: a
// value that changed in Redis (another process, a refund, an expiry) no
// longer matches, and the call reads the state as it would have without
// the cache. A value is the whole state of its rule, so a match is never
// stale.
//
// It holds at most max keys in two generations: stores go to cur; when cur
// holds max/2 keys it becomes old, and old is dropped. A lookup reads both.
// So the entries are at least the latest max/2 keys stored, in O(1) per
// call and nothing run in the background. Every method is a no-op on a nil
// *stateCache (the cache is off).
type stateCache struct {
	mu       sync.Mutex
	half     int
	cur, old map[string]seenState
}

// seenState is one key's entry: the rules it was seen with (a set is
// shared by every call of the same rules) and their values ("" for none),
// and whether the key is crowded here: its last admission had other calls
// of this Limiter waiting for it. The returning key's gate admits one call;
// a crowded key's calls share a lock hold instead (see carryOn).
type seenState struct {
	set     *ruleSet
	values  []string
	crowded bool
}

// A crowding says what store does with a key's crowded mark.
type crowding int8

const (
	keepCrowding crowding = iota // as it was (a read)
	calm                         // an admission with no other call waiting
	crowded                      // an admission with other calls waiting
)

// newStateCache returns a cache of at most max keys (at least 2).
func newStateCache(max int) *stateCache {
	return &stateCache{half: max / 2, cur: make(map[string]seenState)}
}

// lookup returns the values seen for key's rules set (nil if none), and
// whether the key is crowded.
func (c *stateCache) lookup(key string, set *ruleSet) ([]string, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	e, ok := c.cur[key]
	if !ok {
		e = c.old[key]
	}
	c.mu.Unlock()
	if e.set != set {
		return nil, false
	}
	return e.values, e.crowded
}

// store remembers values as key's state for the rules of set, and marks it
// as crowd says; values nil forgets key (what Redis holds is not known).
// It never writes into a slice it keeps: lookup's callers send its strings
// by pointer.
func (c *stateCache) store(key string, set *ruleSet, values []string, crowd crowding) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if values == nil {
		delete(c.cur, key)
		delete(c.old, key)
		return
	}
	e, ok := c.cur[key]
	if !ok {
		e = c.old[key]
		if len(c.cur) >= c.half {
			c.old, c.cur = c.cur, make(map[string]seenState, c.half)
		}
	}
	e.set, e.values = set, values
	if crowd != keepCrowding {
		e.crowded = crowd == crowded
	}
	c.cur[key] = e
}
