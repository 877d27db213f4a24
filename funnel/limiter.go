package funnel

import (
	_ "embed"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/internal/nilcheck"
	"github.com/funnelguard/funnelguard/internal/outage"
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
	//go:embed admit.lua
	admitSrc string
	//go:embed returning.lua
	returningSrc string
	//go:embed commit.lua
	commitSrc string

	readGate = mutex.NewGate(readSrc) // Allow: deny without the lock
	// Allow: deny without the lock, or admit a key with no state in one
	// round trip (admit.lua runs read.lua's body as read_state).
	admitGate = mutex.NewGate(readStateFunc + admitSrc)
	// Allow: admit a returning key in one round trip (returning.lua).
	returningGate = mutex.NewGate(readStateFunc + returningSrc)
	// readStateFunc is read.lua as the function read_state, for the scripts
	// that read the state first (admit.lua, penalty.lua).
	readStateFunc = "local function read_state()\n" + readSrc + "\nend\n"

	// Allow: a crowded key's commit without the lock (commitfree.go).
	commitScript = redis.NewScript(readStateFunc + commitSrc)

	readAll   = mutex.NewFragment(readSrc) // Refund: always take the lock
	readPeek  = redis.NewScript(readSrc)   // Peek: no lock at all
	writeBack = mutex.NewFragment(writeSrc)
	resetAll  = mutex.NewFragment(resetSrc)
)

// A Limiter decides calls against funnels kept in Redis. Each key's state is
// one hash, written only by a script that knows nobody else is writing it: a
// call that is deniable when it arrives costs one round trip, without waiting
// for the lock (not under a rule made with Sharing, which keeps no gate); an
// admission of a key with no state, or of a returning key whose state is
// still the one this Limiter last read or wrote, costs one (one script
// decides and writes; see the package documentation for the exceptions:
// WithUniformCost, PerDay and PerMonth rules, and a returning key under
// Window or Sharing rules); any other admission costs two: the
// state read with the attempt to lock the key, then written, only while the
// lock is still held, in the script that releases it. The zero value is not
// usable; call New. A Limiter is safe for concurrent use.
type Limiter struct {
	client mutex.Client
	locker *mutex.Locker
	prefix string
	lease  time.Duration
	hold   []mutex.Option // mutex.WithTTL(lease) (and WithAckAtRelease), made once
	// runner sends the Limiter's own scripts (Peek's read, a crowded key's
	// read and commit) so that they end by their context's end, whatever the
	// client's options (the Locker does the same for its own).
	runner ctxcall.Runner
	// dial connects as the client does (nil for a cluster or a ring): a
	// release after its call left waits for it to connect (unlock.go).
	dial outage.Dial

	// compiled caches validated rules: a Rule is a small comparable value,
	// and callers pass the same few on every call.
	mu       sync.RWMutex
	compiled map[Rule]rule
	// sets caches the compiled rules of a call, with their fields boxed
	// as script arguments, for calls of up to setMax rules.
	sets map[setKey]*ruleSet

	// batches groups concurrent admissions of a key (see batch.go);
	// alone turns that off (WithoutBatching).
	batches batches
	alone   bool
	// turns orders the batches of a crowded key (turns.go).
	turns turns
	// uniform: no one-round-trip admission of a key with no state
	// (WithUniformCost).
	uniform bool

	// denials is the local deny cache (WithDenyCache); nil when off.
	denials *denyCache
	// states is the state cache of returning keys (WithStateCache); nil
	// when off.
	states *stateCache

	// penalty is WithPenalty's denials, window and box (µs), boxed as
	// script arguments; nil without a penalty box.
	penalty []any

	// acks and ackTimeout are WithReplicaAck's, for the Limiter's own
	// Locker; acks is 0 without it.
	acks       int
	ackTimeout time.Duration

	// lockKeys: the Locker's lock keys are built as keys builds them.
	lockKeys bool

	// clock is the latest sample of the server's clock: it bounds the
	// one-round-trip admission's write (serverclock.go).
	clock serverClock
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
type Option func(*Limiter) error

// WithLocker makes the Limiter lock keys with l (which must use the same
// Redis) instead of a Locker of its own. The Limiter locks the name key for
// a call on key: names are shared with everything else that uses l. A
// quorum Locker (mutex.NewQuorum) cannot run the funnel's scripts with its
// locks.
func WithLocker(l *mutex.Locker) Option {
	return func(lim *Limiter) error {
		switch {
		case l == nil:
			return fmt.Errorf("%w: nil Locker", ErrInvalidOption)
		case l.Nodes() > 1:
			return fmt.Errorf("%w: a quorum Locker (the funnel's state must live in the lock's one Redis)", ErrInvalidOption)
		}
		lim.locker = l
		return nil
	}
}

// WithPrefix sets the prefix of the state keys (DefaultPrefix if unset): the
// state of key lives at <prefix>{<key>}:f, in the cluster slot of the
// key's lock.
func WithPrefix(prefix string) Option {
	return func(lim *Limiter) error {
		if err := keyspace.CheckPrefix(prefix); err != nil {
			return fmt.Errorf("%w: prefix: %w", ErrInvalidOption, err)
		}
		lim.prefix = prefix
		return nil
	}
}

// WithLease sets the lease of the lock around one read-modify-write
// (DefaultLease if unset): 1 ms to mutex.MaxTTL.
func WithLease(d time.Duration) Option {
	return func(lim *Limiter) error {
		if d < time.Millisecond || d > mutex.MaxTTL {
			return fmt.Errorf("%w: lease %v: want 1ms to %v", ErrInvalidOption, d, mutex.MaxTTL)
		}
		lim.lease = d
		return nil
	}
}

// WithoutBatching makes every admission take the key's lock for itself.
// By default, the concurrent admissions of one key (with the same rules) in
// one Limiter share one lock hold: one read, their decisions made in arrival
// order on it, one write. Their outcomes are the same either way; batching
// takes two round trips per batch instead of two per call on a hot key.
// (Apart from this, the Limiter's Locker sends the commands of overlapping
// calls in shared pipelines; WithLocker with a Locker made with
// mutex.WithoutPipelining turns that off.)
func WithoutBatching() Option {
	return func(lim *Limiter) error {
		lim.alone = true
		return nil
	}
}

// WithDenyCache turns on the local deny cache, bounded to maxKeys keys (1
// to MaxDenyCache; off by default). A call for a key that this Limiter saw
// denied is then denied in this process, without Redis, until the gate
// time of that denial: the time at which Redis said the same call would be
// admitted, kept as the RetryAfter that Redis computed on its own clock,
// counted from before the call was sent, on this process's monotonic
// clock. It answers a call with the same rules (in the same order) and at
// least as many units as the cached denial, with that denial's Result: Rule,
// Remaining and Tightest as Redis gave them, RetryAfter, ResetAfter and
// TightestReset counting down. So it never denies past the gate time (given clocks that
// run at the same rate); it may send a call to Redis a little before it
// (by the time the denied call took to reach Redis). A call of more units than the cached one gets
// the cached wait, which is the shortest its own can be.
//
// A Refund or Reset through this Limiter clears the key's entry at once. A
// refund or reset in another process (or another Limiter), or any other
// change of the key in Redis, takes effect there at once and here at the
// cached gate time at the latest: until then this Limiter keeps denying the
// key. Peek always reads Redis.
//
// The cache keeps the latest denial of each key, for the maxKeys keys most
// recently denied by Redis (the oldest are evicted first), and runs no
// goroutine. A hit answers without looking at the call's ctx.
// Calls of more than 4 rules, or of rules past the Limiter's first 256
// distinct sets, are never answered from it.
func WithDenyCache(maxKeys int) Option {
	return func(lim *Limiter) error {
		if maxKeys < 1 || maxKeys > MaxDenyCache {
			return fmt.Errorf("%w: deny cache of %d keys: want 1 to %d", ErrInvalidOption, maxKeys, MaxDenyCache)
		}
		lim.denials = newDenyCache(maxKeys)
		return nil
	}
}

// WithStateCache sets how many keys' state the Limiter remembers
// (DefaultStateCache if unset; 0 turns it off, at most MaxStateCache). A
// key that comes back (a phone number, an IP, a tenant) is then admitted in
// one round trip instead of two while its lock is free and its state in
// Redis is what this Limiter last read or wrote: the call sends what it
// decides on those values, and Redis checks that they are still there.
// Where they are not (another process or a refund changed them, they
// expired), the call costs what it would without the cache. The decisions
// are the same either way. The cache keeps, at least, the latest
// maxKeys/2 keys admitted or read (about 150 bytes a key), and runs no
// goroutine.
func WithStateCache(maxKeys int) Option {
	return func(lim *Limiter) error {
		switch {
		case maxKeys < 0 || maxKeys > MaxStateCache:
			return fmt.Errorf("%w: state cache of %d keys: want 0 to %d", ErrInvalidOption, maxKeys, MaxStateCache)
		case maxKeys == 0:
			lim.states = nil
		default:
			lim.states = newStateCache(max(maxKeys, 2))
		}
		return nil
	}
}

// WithUniformCost makes every admission take the key's lock, whether the
// key has state or not, and turns the state cache off (WithStateCache). By
// default a call for a key none of whose rules has state, while its lock is
// free (the first call on a key, or one after every funnel emptied and
// expired), is admitted in one round trip, by the script that reads the
// state, and so is a key whose state this Limiter saw last; a key with
// state written elsewhere takes one round trip more, which a caller timing
// the answers could tell apart (a phone number that was sent codes, for
// one).
func WithUniformCost() Option {
	return func(lim *Limiter) error {
		lim.uniform = true
		return nil
	}
}

// WithReplicaAck makes every admission's commit (and every other write
// that grants or keeps a key's lock) wait until n replicas acknowledged it,
// for at most timeout: mutex.WithReplicaAck on the Limiter's Locker (with
// WithLocker, set it on that Locker instead). An admission whose commit was
// not acknowledged returns an error matching mutex.ErrNotReplicated: its
// charge stands on the master (the Limiter errs toward denying), and the
// caller should not act on it. Keys with no state are admitted through the
// lock like any other (WithUniformCost), since that one-round-trip
// admission writes in a script that waits for nobody. An admission still
// takes two round trips: the read with the lock, and the commit with its
// WAIT, which covers the lock's acquisition too (mutex.WithAckAtRelease); a
// denial takes one.
func WithReplicaAck(n int, timeout time.Duration) Option {
	return func(lim *Limiter) error {
		if n < 1 || timeout < time.Millisecond {
			return fmt.Errorf("%w: replica acknowledgement by %d replicas within %v: want at least 1 within at least 1ms", ErrInvalidOption, n, timeout)
		}
		lim.acks, lim.ackTimeout = n, timeout
		return nil
	}
}

// New returns a Limiter on client. A nil client or a bad option is an error
// matching ErrInvalidOption (with the mutex package's error when the
// Limiter's own Locker refuses the client).
func New(client mutex.Client, opts ...Option) (*Limiter, error) {
	if nilcheck.IsNil(client) {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOption)
	}
	lim := &Limiter{client: client, prefix: DefaultPrefix, lease: DefaultLease, runner: ctxcall.NewRunner(client), dial: outage.DialOf(client)}
	lim.clock.base = time.Now()
	lim.states = newStateCache(DefaultStateCache)
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(lim); err != nil {
			return nil, err
		}
	}
	if err := lim.wireLocker(); err != nil {
		return nil, err
	}
	lim.holdOptions()
	// keys makes the lock's key itself only where it is the Locker's.
	lim.lockKeys = lim.locker.LockKey("k") == keyspace.Key(lim.prefix, "k", lockKind) &&
		lim.locker.LockKey("{a}~") == keyspace.Key(lim.prefix, "{a}~", lockKind)
	return lim, nil
}

// wireLocker makes the Limiter's own Locker, unless WithLocker gave one,
// which must then wait for the replicas WithReplicaAck asks for.
func (lim *Limiter) wireLocker() error {
	if lim.locker != nil {
		return lim.checkLockerAcks()
	}
	lopts := []mutex.Option{mutex.WithPrefix(lim.prefix)}
	if lim.acks > 0 {
		lopts = append(lopts, mutex.WithReplicaAck(lim.acks, lim.ackTimeout))
	}
	l, err := mutex.New(lim.client, lopts...)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	lim.locker = l
	return nil
}

// checkLockerAcks refuses a WithReplicaAck that WithLocker's Locker does not
// keep: the Locker's writes are the ones that wait.
func (lim *Limiter) checkLockerAcks() error {
	if lim.acks == 0 {
		return nil
	}
	if n, d := lim.locker.ReplicaAck(); n != lim.acks || d != lim.ackTimeout {
		return fmt.Errorf("%w: WithReplicaAck(%d, %v) with a Locker that waits for %d replicas within %v: set it on the Locker", ErrInvalidOption, lim.acks, lim.ackTimeout, n, d)
	}
	return nil
}

// holdOptions sets how the Limiter holds its locks and whether a fresh key
// may be admitted in the gate (admit.lua).
func (lim *Limiter) holdOptions() {
	lim.hold = []mutex.Option{mutex.WithTTL(lim.lease)}
	n, _ := lim.locker.ReplicaAck()
	if n > 0 {
		// The commit's WAIT covers the acquisition: the Limiter acts on
		// nothing before it.
		lim.hold = append(lim.hold, mutex.WithAckAtRelease())
	}
	// admit.lua's write would wait for no replica, and would not look at
	// the penalty box.
	lim.uniform = lim.uniform || n > 0 || lim.penalty != nil
}

// Locker returns the Locker that the Limiter locks keys with: its own, or
// WithLocker's.
func (lim *Limiter) Locker() *mutex.Locker {
	if lim == nil {
		return nil
	}
	return lim.locker
}

// call is one validated request.
type call struct {
	key   string // the state key
	name  string // the lock name
	lock  string // the lock's key, when made with key (else "")
	set   *ruleSet
	rules []rule
	ids   []any
}

// check validates the Limiter and a key.
func (lim *Limiter) check(key string) error {
	if lim == nil {
		return errNilLimiter
	}
	return checkKey(key)
}

// stateKey is where the state of key lives: in the slot of key's lock.
func (lim *Limiter) stateKey(key string) string {
	return keyspace.Key(lim.prefix, key, "f")
}

func (lim *Limiter) prepare(key string, rules []Rule) (call, error) {
	if err := lim.check(key); err != nil {
		return call{}, err
	}
	s, err := lim.ruleSet(rules)
	if err != nil {
		return call{}, err
	}
	c := call{name: key, set: s, rules: s.rules, ids: s.ids}
	c.key, c.lock = lim.keys(key)
	return c, nil
}

// keys returns the state key of key and, when the Limiter's Locker keys
// its locks under the Limiter's prefix (its own Locker does), the key of
// key's lock, both cut from one string: one allocation for the two.
func (lim *Limiter) keys(key string) (state, lock string) {
	if !lim.lockKeys {
		return lim.stateKey(key), ""
	}
	tag := keyspace.Tag(key)
	var b strings.Builder
	b.Grow(2*(len(lim.prefix)+len(tag)+3) + len("f") + len(lockKind))
	b.WriteString(lim.prefix)
	b.WriteByte('{')
	b.WriteString(tag)
	b.WriteString("}:f")
	cut := b.Len()
	b.WriteString(lim.prefix)
	b.WriteByte('{')
	b.WriteString(tag)
	b.WriteString("}:" + lockKind)
	s := b.String()
	return s[:cut], s[cut:]
}

// lockKind is the kind of the lock's key (mutex.Locker.LockKey's), checked
// in New against the Locker's own (lockKeys).
const lockKind = "lock"

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
	// admit1 is admit.lua's arguments for a call of one unit, but its
	// deadline and nonce: the fields, each rule's new value without its time, the TTL.
	admit1 []any
	// calendar is set when a rule counts calendar periods: admit.lua cannot
	// write its value (the wait and TTL depend on the period's end), so
	// the call reads with read.lua (admit1 is nil).
	calendar bool
	// funnels is set when every rule is a funnel (no window, no calendar
	// rule): returning.lua can decide the call (the state cache keeps it).
	// Then fresh1 and freshTTL1 are each rule's value after one unit on
	// an empty funnel, without its time, and its TTL (rule.fresh).
	funnels   bool
	fresh1    []string
	freshTTL1 []int64
}

// ruleSet returns the compiled rules, from the cache when possible.
func (lim *Limiter) ruleSet(rules []Rule) (*ruleSet, error) {
	if len(rules) > setMax {
		return newRuleSet(rules, lim.compile)
	}
	var k setKey
	k.n = copy(k.rules[:], rules)
	lim.mu.RLock()
	s := lim.sets[k]
	lim.mu.RUnlock()
	if s != nil {
		return s, nil
	}
	s, err := newRuleSet(rules, lim.compile)
	if err != nil {
		return nil, err
	}
	return lim.keepSet(k, s), nil
}

// newRuleSet compiles rules with compile.
func newRuleSet(rules []Rule, compile func(Rule) (rule, error)) (*ruleSet, error) {
	rs, err := compileRules(rules, compile)
	if err != nil {
		return nil, err
	}
	s := &ruleSet{rules: rs, ids: make([]any, len(rs))}
	for i, r := range rs {
		s.ids[i] = r.arg
	}
	s.calendar = slices.ContainsFunc(rs, func(r rule) bool { return r.cal != nil })
	s.funnels = !s.calendar && !slices.ContainsFunc(rs, func(r rule) bool { return r.window > 0 })
	if s.funnels {
		s.fresh1, s.freshTTL1 = make([]string, len(rs)), make([]int64, len(rs))
		for i, r := range rs {
			s.fresh1[i], s.freshTTL1[i] = r.fresh(1)
		}
	}
	if !s.calendar {
		s.admit1 = admitArgs(rs, s.ids, 1)
	}
	return s, nil
}

// keepSet caches s as the set of the rules k while there is room, and
// returns the set of k: s, or the one another call cached meanwhile.
func (lim *Limiter) keepSet(k setKey, s *ruleSet) *ruleSet {
	lim.mu.Lock()
	defer lim.mu.Unlock()
	if first := lim.sets[k]; first != nil {
		// One set per rules, so that calls with the same rules share
		// batches and cached denials.
		return first
	}
	if len(lim.sets) < maxCompiled {
		if lim.sets == nil {
			lim.sets = make(map[setKey]*ruleSet)
		}
		lim.sets[k] = s
	}
	return s
}

func (c call) read(f *mutex.Fragment) mutex.Call {
	return mutex.Call{Fragment: f, Keys: []string{c.key}, Args: c.ids}
}

// admitCall holds what admit returns for a call of one unit on up to
// setMax rules, in one allocation: the arguments (admit.lua's, then the
// deadline and the nonce, passed as pointers: go-redis writes *int64 and
// *string as their values, where boxing each would allocate), the keys.
type admitCall struct {
	args     [2*setMax + 3]any
	keys     [2]string
	deadline int64
	nonce    string
}

// admit returns Allow's gate for a call of n units (admit.lua), which
// checks that lock, the key's lock, is free, and writes only before the
// server time deadline (see serverclock.go).
func (c call) admit(n int64, lock string, deadline int64, nonce string) mutex.Call {
	m := &admitCall{deadline: deadline, nonce: nonce}
	var args []any
	if n == 1 && len(c.set.admit1)+2 <= len(m.args) {
		args = append(m.args[:0], c.set.admit1...)
	} else {
		args = admitArgs(c.rules, c.ids, n)
	}
	args = append(args, &m.deadline, &m.nonce)
	m.keys[0], m.keys[1] = c.key, lock
	return mutex.Call{Fragment: admitGate, Keys: m.keys[:], Args: args}
}

// newNonce returns a gate's nonce: 41 random bits, so that another call's
// value ending in it is not taken for this call's own.
func newNonce() string {
	return strconv.FormatUint(rand.Uint64()>>23, 36)
}

// admitArgs returns admit.lua's arguments for n units, but the deadline
// and the nonce: the fields; each rule's value after n units on an empty
// funnel (or window), without its time; and the key's TTL in ms, until
// every funnel is empty again.
func admitArgs(rules []rule, ids []any, n int64) []any {
	args := append(make([]any, 0, 2*len(rules)+3), ids...)
	var ttl int64
	for _, r := range rules {
		v, t := r.fresh(n)
		args = append(args, v)
		ttl = max(ttl, t)
	}
	return append(args, ttl)
}
