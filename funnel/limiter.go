package funnel

import (
	_ "embed"
	"fmt"
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/internal/nilcheck"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// Defaults and limits of a Limiter.
const (
	DefaultPrefix = mutex.DefaultPrefix
	// DefaultLease is the lease of the lock around one read-modify-write,
	// which takes two round trips: long enough for a slow network, short
	// enough that a crashed caller blocks a key only briefly.
	DefaultLease = time.Second
	// MaxKeyLen is the longest key accepted, in bytes.
	MaxKeyLen = mutex.MaxNameLen
	// maxCommits bounds the retries of a commit whose lock lapsed.
	maxCommits = 8
)

var (
	//go:embed read.lua
	readSrc string
	//go:embed write.lua
	writeSrc string
	//go:embed reset.lua
	resetSrc string

	readGate  = mutex.NewGate(readSrc)     // Allow: deny without the lock
	readAll   = mutex.NewFragment(readSrc) // Refund: always take the lock
	readPeek  = redis.NewScript(readSrc)   // Peek: no lock at all
	writeBack = mutex.NewFragment(writeSrc)
	resetAll  = mutex.NewFragment(resetSrc)
)

// A Limiter decides calls against funnels kept in Redis. Each key's state is
// one hash, read with the attempt to lock the key and written, only while the
// lock is still held, in the script that releases it: an admission costs two
// round trips when the key is not locked, and a call that is deniable when it
// arrives costs one, without waiting for the lock. The zero value is not usable; call New. A Limiter is
// safe for concurrent use.
type Limiter struct {
	client mutex.Client
	locker *mutex.Locker
	prefix string
	lease  time.Duration
	hold   mutex.LockOption // mutex.Lease(lease), made once
	err    error
	// honours is set when the client bounds commands by their context's
	// deadline; Peek runs under ctxcall otherwise (the Locker does the same).
	honours bool

	// compiled caches validated rules: a Rule is a small comparable value,
	// and callers pass the same few on every call.
	mu       sync.RWMutex
	compiled map[Rule]rule
	// sets caches the compiled rules of a call, with their fields boxed
	// as script arguments, for calls of up to setMax rules.
	sets map[setKey]*ruleSet

	// beforeCommit, if set, runs between the read and the commit (tests).
	beforeCommit func()
}

// maxCompiled bounds the rule cache; rules past it are compiled per call.
const maxCompiled = 256

// compile returns r validated, from the cache when possible.
func (lim *Limiter) compile(r Rule) (rule, error) {
	lim.mu.RLock()
	c, ok := lim.compiled[r]
	lim.mu.RUnlock()
	if ok {
		return c, nil
	}
	c, err := r.compile()
	if err != nil {
		return rule{}, err
	}
	lim.mu.Lock()
	if len(lim.compiled) < maxCompiled {
		if lim.compiled == nil {
			lim.compiled = make(map[Rule]rule)
		}
		lim.compiled[r] = c
	}
	lim.mu.Unlock()
	return c, nil
}

// An Option configures a Limiter in New.
type Option func(*Limiter)

// WithLocker makes the Limiter lock keys with l (which must use the same
// Redis) instead of a Locker of its own. The Limiter locks the name key for
// a call on key: names are shared with everything else that uses l.
func WithLocker(l *mutex.Locker) Option {
	return func(lim *Limiter) {
		if l == nil {
			lim.fail(fmt.Errorf("%w: nil Locker", ErrInvalidOption))
			return
		}
		if err := l.Err(); err != nil {
			lim.fail(fmt.Errorf("%w: unusable Locker: %w", ErrInvalidOption, err))
		}
		lim.locker = l
	}
}

// WithPrefix sets the prefix of the state keys (DefaultPrefix if unset): the
// state of key lives at <prefix>{<key>}:funnel, in the cluster slot of the
// key's lock.
func WithPrefix(prefix string) Option {
	return func(lim *Limiter) {
		if err := keyspace.CheckPrefix(prefix); err != nil {
			lim.fail(fmt.Errorf("%w: %w", ErrInvalidOption, err))
			return
		}
		lim.prefix = prefix
	}
}

// WithLease sets the lease of the lock around one read-modify-write
// (DefaultLease if unset).
func WithLease(d time.Duration) Option {
	return func(lim *Limiter) {
		if d < time.Millisecond {
			lim.fail(fmt.Errorf("%w: lease %v", ErrInvalidOption, d))
			return
		}
		lim.lease = d
	}
}

func (lim *Limiter) fail(err error) {
	if lim.err == nil {
		lim.err = err
	}
}

// New returns a Limiter on client. A nil client or a bad option does not
// panic: every call then returns the error.
func New(client mutex.Client, opts ...Option) *Limiter {
	lim := &Limiter{client: client, prefix: DefaultPrefix, lease: DefaultLease}
	for _, o := range opts {
		if o != nil {
			o(lim)
		}
	}
	if lim.locker == nil {
		lim.locker = mutex.New(client, mutex.WithPrefix(lim.prefix))
	}
	lim.hold = mutex.Lease(lim.lease)
	if nilcheck.IsNil(client) {
		lim.err = ErrNilClient // before any option's error: nothing works without a client
	} else {
		lim.honours = ctxcall.Honours(client)
	}
	return lim
}

// call is one validated request.
type call struct {
	key   string // the state key
	name  string // the lock name
	rules []rule
	ids   []any
}

// check validates the Limiter and a key.
func (lim *Limiter) check(key string) error {
	if lim.err != nil {
		return lim.err
	}
	if key == "" || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes (want 1 to %d)", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

// stateKey is where the state of key lives: in the slot of key's lock.
func (lim *Limiter) stateKey(key string) string {
	return keyspace.Key(lim.prefix, key, "funnel")
}

func (lim *Limiter) prepare(key string, rules []Rule) (call, error) {
	if err := lim.check(key); err != nil {
		return call{}, err
	}
	s, err := lim.ruleSet(rules)
	if err != nil {
		return call{}, err
	}
	return call{key: lim.stateKey(key), name: key, rules: s.rules, ids: s.ids}, nil
}

// setMax is the most rules of a call whose compiled set is cached.
const setMax = 4

// setKey identifies the rules of a call, in order.
type setKey struct {
	n     int
	rules [setMax]Rule
}

// A ruleSet is the compiled rules of a call and their fields as script
// arguments; shared by calls, never modified.
type ruleSet struct {
	rules []rule
	ids   []any
}

// ruleSet returns the compiled rules, from the cache when possible.
func (lim *Limiter) ruleSet(rules []Rule) (*ruleSet, error) {
	var k setKey
	cacheable := len(rules) <= setMax
	if cacheable {
		k.n = copy(k.rules[:], rules)
		lim.mu.RLock()
		s := lim.sets[k]
		lim.mu.RUnlock()
		if s != nil {
			return s, nil
		}
	}
	rs, err := compileRules(rules, lim.compile)
	if err != nil {
		return nil, err
	}
	s := &ruleSet{rules: rs, ids: make([]any, len(rs))}
	for i, r := range rs {
		s.ids[i] = r.arg
	}
	if cacheable {
		lim.mu.Lock()
		if len(lim.sets) < maxCompiled {
			if lim.sets == nil {
				lim.sets = make(map[setKey]*ruleSet)
			}
			lim.sets[k] = s
		}
		lim.mu.Unlock()
	}
	return s, nil
}

func (c call) read(f *mutex.Fragment) mutex.Call {
	return mutex.Call{Fragment: f, Keys: []string{c.key}, Args: c.ids}
}
