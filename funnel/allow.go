package funnel

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/mutex"
)

// Allow is shorthand for AllowN(ctx, key, 1, rules...).
func (lim *Limiter) Allow(ctx context.Context, key string, rules ...Rule) (Result, error) {
	return lim.AllowN(ctx, key, 1, rules...)
}

// AllowN admits n units for key if they fit in every rule, and takes them
// from every rule; otherwise it takes nothing. n is 1 to every rule's
// Capacity. An admission writes only on the state it decided on, so a
// stale decision never overwrites newer state. A call with a ctx deadline
// that returns an error took nothing; without a deadline, an error after
// the write was sent may leave the call admitted. A call whose ctx ends
// while it waits in a batch returns ctx's error, unless the batch decided
// it meanwhile.
func (lim *Limiter) AllowN(ctx context.Context, key string, n int64, rules ...Rule) (Result, error) {
	c, err := lim.prepare(ctx, key, rules)
	if err != nil {
		return Result{}, err
	}
	if err := checkN(c.set.rules, n); err != nil {
		return Result{}, err
	}
	if lim.denials != nil { // keyed by key: a cached denial makes no key
		if res, ok := lim.denials.lookup(key, c.set, n); ok {
			return res, nil
		}
	}
	c.key, c.lock = lim.keys(key)
	if lim.alone {
		return lim.allowAlone(ctx, c, n)
	}
	return lim.allowBatched(ctx, c, n)
}

func checkKey(key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes (want 1 to %d)", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

func checkN(rules []rule, n int64) error {
	for _, r := range rules {
		if n < 1 || n > r.full/r.per { // not n*per > full: that can overflow
			return fmt.Errorf("%w: %d units for rule %q of capacity %d", ErrInvalidN, n, r.name, r.full/r.per)
		}
	}
	return nil
}

// corrupt marks a WRONGTYPE error: the state key holds no funnel's hash.
func corrupt(err error) error {
	if err != nil && strings.Contains(err.Error(), "WRONGTYPE") {
		return fmt.Errorf("%w: %w", ErrCorruptState, err)
	}
	return err
}

// call is one validated request.
type call struct {
	key  string   // the state key
	name string   // the lock name
	lock string   // the lock's key ("" until needed, unless made with key)
	set  *ruleSet // nil for Reset
}

func (lim *Limiter) check(ctx context.Context, key string) error {
	switch {
	case ctx == nil:
		return ErrNilContext
	case lim == nil:
		return errNilLimiter
	}
	return checkKey(key)
}

// prepare checks a call of key and compiles its rules; it makes no key.
func (lim *Limiter) prepare(ctx context.Context, key string, rules []Rule) (call, error) {
	if err := lim.check(ctx, key); err != nil {
		return call{}, err
	}
	set, err := lim.ruleSet(rules)
	return call{name: key, set: set}, err
}

func (c call) read(f *mutex.Fragment) mutex.Call {
	return mutex.Call{Fragment: f, Keys: []string{c.key}, Args: c.set.ids}
}

// keys returns the state key of key, in the slot of key's lock, and, when
// the Locker keys its locks under the Limiter's prefix (its own does), the
// key of key's lock, cut from one string.
func (lim *Limiter) keys(key string) (state, lock string) {
	if !lim.lockKeys {
		return keyspace.Key(lim.prefix, key, "f"), ""
	}
	tag := keyspace.Tag(key)
	s := lim.prefix + "{" + tag + "}:f" + lim.prefix + "{" + tag + "}:" + lockKind // one allocation
	cut := len(lim.prefix) + len(tag) + len("{}:f")
	return s[:cut], s[cut:]
}

// lockKind is the kind of the lock's key (mutex.Locker.LockKey's).
const lockKind = "lock"

// maxCompiled bounds the caches of rules and sets (memo).
const maxCompiled = 256

// setMax is the most rules of a call whose compiled set is cached.
const setMax = 4

type setKey struct {
	n     int
	rules [setMax]Rule
}

// A ruleSet is the compiled rules of a call and their script arguments;
// shared by calls, never modified.
type ruleSet struct {
	rules []rule
	ids   []any
	// admit1 is admit.lua's arguments for one unit, but the deadline and
	// the nonce; nil with a calendar rule, whose value admit.lua cannot write.
	admit1 []any
	// funnels: every rule is a funnel, so returning.lua can decide the
	// call; fresh1 and freshTTL1 are then rule.fresh(1) of each.
	funnels   bool
	fresh1    []string
	freshTTL1 []int64
}

// ruleSet returns the compiled rules, from the cache when possible: one set
// per rules, so that calls with the same rules share batches and denials.
func (lim *Limiter) ruleSet(rules []Rule) (*ruleSet, error) {
	if len(rules) > setMax {
		return newRuleSet(rules, &lim.compiled)
	}
	var k setKey
	k.n = copy(k.rules[:], rules)
	return lim.sets.get(k, func() (*ruleSet, error) { return newRuleSet(rules, &lim.compiled) })
}

// A memo caches what build makes of a key, for at most maxCompiled keys
// (past them, it builds per call); the first value cached for a key wins.
// It is safe for concurrent use. A read takes no lock: the map is never
// changed once stored, and a new key stores a copy (at most maxCompiled
// times), so calls on many cores do not contend on a reader count.
type memo[K comparable, V any] struct {
	mu sync.Mutex // orders the copies
	m  atomic.Pointer[map[K]V]
}

func (c *memo[K, V]) load() map[K]V {
	if p := c.m.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *memo[K, V]) get(k K, build func() (V, error)) (V, error) {
	if v, ok := c.load()[k]; ok {
		return v, nil
	}
	v, err := build()
	if err != nil {
		return v, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.load()
	if first, ok := old[k]; ok {
		return first, nil
	}
	if len(old) < maxCompiled {
		m := make(map[K]V, len(old)+1)
		maps.Copy(m, old)
		m[k] = v
		c.m.Store(&m)
	}
	return v, nil
}

func newRuleSet(rules []Rule, cache *memo[Rule, rule]) (*ruleSet, error) {
	rs, err := compileRules(rules, cache)
	if err != nil {
		return nil, err
	}
	s := &ruleSet{rules: rs, ids: make([]any, len(rs))}
	for i, r := range rs {
		s.ids[i] = r.arg
	}
	calendar := slices.ContainsFunc(rs, func(r rule) bool { return r.cal != nil })
	s.funnels = !calendar && !slices.ContainsFunc(rs, func(r rule) bool { return r.window > 0 || r.shared })
	if s.funnels {
		s.fresh1, s.freshTTL1 = make([]string, len(rs)), make([]int64, len(rs))
		for i, r := range rs {
			s.fresh1[i], s.freshTTL1[i] = r.fresh(1)
		}
	}
	if !calendar {
		s.admit1 = admitArgs(rs, s.ids, 1)
	}
	return s, nil
}
