package funnel

import (
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/internal/forgetful"
)

// DefaultLocalKeys is how many keys a Local remembers when NewLocal is given
// no positive bound.
const DefaultLocalKeys = 10000

// A Local decides rules in this process's memory with a Limiter's
// arithmetic, on the wall clock at its creation plus the monotonic time
// since: a guard's fallback while Redis cannot answer. It remembers at most
// its bound of keys, forgetting the older half past it (a forgotten key
// starts empty). It is safe for concurrent use and starts no goroutine;
// call NewLocal.
type Local struct {
	base time.Time

	mu       sync.Mutex
	keys     *forgetful.Map[string, map[string]level] // key -> rule id -> level
	compiled memo[Rule, rule]
}

// NewLocal returns a Local that remembers at most maxKeys keys
// (DefaultLocalKeys if maxKeys < 1).
func NewLocal(maxKeys int) *Local {
	if maxKeys < 1 {
		maxKeys = DefaultLocalKeys
	}
	return &Local{base: time.Now(), keys: forgetful.New[string, map[string]level](maxKeys)}
}

// Allow is shorthand for AllowN(time.Now(), key, 1, rules...).
func (l *Local) Allow(key string, rules ...Rule) (Result, error) {
	return l.AllowN(time.Now(), key, 1, rules...)
}

// AllowN admits n units for key at now if they fit in every rule, all or
// nothing, as Limiter.AllowN does; a time before the Local's creation
// counts as its creation. A failed call changes nothing.
func (l *Local) AllowN(now time.Time, key string, n int64, rules ...Rule) (Result, error) {
	if err := checkKey(key); err != nil {
		return Result{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	rs, err := compileRules(rules, &l.compiled)
	if err != nil {
		return Result{}, err
	}
	if err := checkN(rs, n); err != nil {
		return Result{}, err
	}
	us := l.base.Add(max(now.Sub(l.base), 0)).UnixMicro()
	st, _ := l.keys.Get(key) // rule id -> level; nil: none yet
	levels := make([]level, len(rs))
	for i, r := range rs {
		levels[i] = st[r.id]
	}
	d := decide(rs, levels, us, n)
	if d.allowed {
		if st == nil {
			st = make(map[string]level, 1)
			l.keys.Put(key, st)
		}
		for i, r := range rs {
			st[r.id] = d.level(i) // a window's log is new: never shared
		}
	}
	return d.result(rs), nil
}

// Len reports how many keys the Local remembers.
func (l *Local) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.keys.Len()
}
