package funnel

import "sync"

// DefaultStateCache is how many keys' state a Limiter remembers by default
// (WithStateCache).
const DefaultStateCache = 1 << 14

// MaxStateCache is the most keys WithStateCache accepts.
const MaxStateCache = 1 << 24

// A stateCache remembers, per state key, its rules' values as this Limiter
// last read or wrote them, for the returning key's gate (gate.go), which
// admits only if Redis holds those very values: an entry needs no
// invalidation. It holds at most max keys in two generations: stores go to
// cur; when cur holds max/2 keys it becomes old, and old is dropped. Every
// method is a no-op on a nil *stateCache (the cache is off).
type stateCache struct {
	mu       sync.Mutex
	half     int
	cur, old map[string]seenState
}

// seenState is one key's entry: the rule set it was seen with, the values
// ("" for none), and whether the key is crowded (its last admission had
// other calls of this Limiter waiting: crowded.go).
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

// crowdingOf is the mark of an admission that had others waiting, or not.
func crowdingOf(others bool) crowding {
	if others {
		return crowded
	}
	return calm
}

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

// store remembers values as key's state for set, marked as crowd says;
// nil values forget key. It never writes into a slice it keeps: lookup's
// callers send its strings by pointer.
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

// saw keeps the values of a read reply, {now, value...}, as the state seen.
func (l *leader) saw(res any) {
	if !l.cache {
		return
	}
	arr, _ := res.([]any)
	if len(arr) != len(l.c.rules)+1 {
		return
	}
	values := make([]string, len(l.c.rules))
	for i := range values {
		values[i], _ = arr[i+1].(string)
	}
	l.seen = values
	l.lim.states.store(l.c.key, l.c.set, values, keepCrowding)
}

// wrote keeps the values of a commit, write.lua's args (field, value pairs
// after two numbers).
func (l *leader) wrote(ws sealed, args []any) {
	if !l.cache {
		return
	}
	values := make([]string, len(l.c.rules))
	for i := range values {
		values[i], _ = args[3+2*i].(string)
	}
	l.lim.states.store(l.c.key, l.c.set, values, crowdingOf(len(ws) > 1))
}
