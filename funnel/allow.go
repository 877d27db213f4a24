package funnel

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	k := batchKey{c.key, c.set}
	d, _ := ctx.Deadline()
	for range lim.joins {
		b, w, lead := lim.batches.join(k, n, d)
		if lead {
			lim.lead(ctx, c, k, b, n)
			return outcome(ctx, w.res, w.err)
		}
		if res, again, err := w.wait(ctx); !again {
			return outcome(ctx, res, err)
		}
	}
	b := newBatch(n, d) // a batch of its own; a leader never runs again
	lim.lead(ctx, c, batchKey{}, b, n)
	return outcome(ctx, b.leader.res, b.leader.err)
}

// outcome returns a call's result and error, errLate no earlier than ctx's
// deadline: a caller reads an error with ctx.Err() == nil as Redis's.
func outcome(ctx context.Context, res Result, err error) (Result, error) {
	if errors.Is(err, errLate) {
		<-ctx.Done() // errLate comes only to calls with a deadline
	}
	return res, err
}

// The open batches: a call whose key and rule set have none opens one and
// leads it (lead); one that finds one joins it and waits (batch.go).
type batchKey struct {
	key string
	set *ruleSet
}

// A batch is the calls of one lock hold, in arrival order. It holds its
// leader's waiter, so that a call that leads alone allocates once.
type batch struct {
	waiters []*waiter
	first   [1]*waiter
	leader  waiter
}

type batches struct {
	mu   sync.Mutex
	open map[batchKey]*batch // made by New
}

// join adds a call of n units with deadline d to k's open batch, or opens
// one that it leads (lead is true).
func (bs *batches) join(k batchKey, n int64, d time.Time) (b *batch, w *waiter, lead bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b := bs.open[k]; b != nil {
		w := &waiter{n: n, deadline: d, done: make(chan struct{})}
		b.waiters = append(b.waiters, w)
		return b, w, false
	}
	b = newBatch(n, d)
	bs.open[k] = b
	return b, &b.leader, true
}

func newBatch(n int64, d time.Time) *batch {
	b := &batch{leader: waiter{n: n, deadline: d}}
	b.first[0] = &b.leader
	b.waiters = b.first[:]
	return b
}

// seal closes b to new calls and returns its calls.
func (bs *batches) seal(k batchKey, b *batch) sealed {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	delete(bs.open, k) // b's, while it is open: a key's next batch opens after this
	return b.waiters
}

// sealed is the calls of a closed batch, the leader's first.
type sealed []*waiter

func (ws sealed) wake() {
	for _, w := range ws {
		if w.done != nil {
			close(w.done)
		}
	}
}

// A leader runs one batch. The calls are passed apart (sealed), so that
// escape analysis keeps them on the stack of a call that leads alone.
type leader struct {
	lim *Limiter
	c   call
	n   int64 // the units of the call its gate is sent for
	// sent is taken before Redis reads its clock (a cached denial's wait
	// counts from it); epoch is the deny cache's then.
	sent  time.Time
	epoch uint64
	recv  time.Time // when the last reply came: a sample of the server's clock
	late  bool      // the last write was refused as late
	// lock is the key's lock for a one-script admission (gate.go), "" for
	// none; seen is the state cache's values, exp what returning.lua was
	// sent for them, nonce the gate's.
	lock  string
	seen  []string
	exp   []expectation
	nonce string
	cache bool // the state cache keeps what the calls read and write
	// optimistic: the key is crowded (crowded.go); next is commit.lua's
	// reply for the next read; lost counts commits that found the state
	// changed.
	optimistic bool
	next       any
	lost       int
}

// lead runs batch b, whose leader asks n units: its attempts, each call's
// decision, one write, and each call's outcome.
func (lim *Limiter) lead(ctx context.Context, c call, k batchKey, b *batch, n int64) {
	var ws, all sealed // all: as sealed, every call woken however ws narrows
	defer func() { all.wake() }()
	l := lim.newLeader(c, n)
	if l.optimistic { // crowded batches of one key read and commit in turn
		done, err := lim.turns.take(ctx, batchKey{c.key, c.set})
		if err != nil {
			all = lim.batches.seal(k, b)
			all.failLeader(err)
			return
		}
		defer done()
	}
	for i := 0; i < maxCommits; i++ {
		if l.next != nil {
			i-- // decided again on commit.lua's reply: bounded by maxLost
		}
		lk, res, err := l.attempt(ctx)
		l.recv = time.Now()
		if ws == nil { // the first reply seals the batch
			ws = lim.batches.seal(k, b)
			all = ws
		}
		l.late = false
		if ws = l.settle(ctx, ws, lk, res, err); len(ws) == 0 {
			return
		}
	}
	ws.giveUp(l.late)
}

// newLeader is the leader of call c of n units: the lock its one-script
// gate checks ("" for none: WithUniformCost, a calendar rule), and, where
// the state cache applies, the state it holds (a crowded batch reads its own).
func (lim *Limiter) newLeader(c call, n int64) leader {
	l := leader{lim: lim, c: c, n: n}
	l.stamp()
	if !lim.uniform && c.set.admit1 != nil { // admit.lua can write the set's values
		if l.c.lock == "" {
			l.c.lock = lim.locker.LockKey(c.name)
		}
		l.lock = l.c.lock
	}
	if l.cache = l.lock != "" && c.set.funnels && lim.states != nil; l.cache {
		l.seen, l.optimistic = lim.states.lookup(c.key, c.set)
	}
	return l
}

// stamp sets sent and epoch, before the leader asks Redis.
func (l *leader) stamp() {
	l.sent = time.Now()
	if d := l.lim.denials; d != nil {
		l.epoch = d.forgets.Load()
	}
}

// attempt chooses the batch's path and runs its first round trip: a
// crowded key's read (crowded.go), else a lock attempt gated by the penalty
// box, the one-script admission (gate.go) or read.lua.
func (l *leader) attempt(ctx context.Context) (*mutex.Lock, any, error) {
	if l.optimistic {
		return l.readFree(ctx)
	}
	lim := l.lim
	// Built here, not returned by a function: its slices stay on the stack.
	var gate mutex.Call
	switch {
	case lim.penalty != nil:
		gate = mutex.Call{Fragment: penaltyGate, Keys: []string{l.c.key}, Args: l.c.penalized(lim.penalty, "1")}
	case l.lock != "" && l.cache:
		if res, decided, err := l.oneScript(ctx); decided {
			return nil, res, err
		}
		gate = l.c.read(readGate)
	case l.lock != "":
		gate, _ = l.admitGate(ctx)
	default:
		gate = l.c.read(readGate)
	}
	lk, res, err := lim.locker.TryLockWith(ctx, l.c.name, gate, lim.hold...)
	if errors.Is(err, mutex.ErrLocked) {
		lk, res, err = lim.locker.LockWith(ctx, l.c.name, gate, lim.hold...)
	}
	return lk, res, err
}

// settle answers the calls ws on an attempt's reply and returns those
// still to decide (none when all are answered): a gate's own admission
// (gate.go), a failed attempt, or a read to decide on and commit (lock.go).
func (l *leader) settle(ctx context.Context, ws sealed, lk *mutex.Lock, res any, err error) sealed {
	declined := errors.Is(err, mutex.ErrDeclined)
	if now, verdict, how := admitted(declined, res); verdict != "" {
		return l.settleGate(ws, now, verdict, how)
	}
	if err != nil && !declined {
		l.failed(ctx, ws, err)
		return nil
	}
	return l.settleRead(ctx, ws, lk, res, declined)
}

// admitted returns the verdict in a declined gate's result, "admitted" or
// "late", the server time it ran at, and how returning.lua wrote each rule;
// verdict is "" for a result of another shape (a read's: its second item is
// a rule's value, never one of the verdicts).
func admitted(declined bool, res any) (now int64, verdict, how string) {
	arr, _ := res.([]any)
	if !declined || len(arr) < 2 {
		return 0, "", ""
	}
	now, ok := arr[0].(int64)
	if verdict, _ = arr[1].(string); !ok || verdict != "admitted" && verdict != "late" {
		return 0, "", ""
	}
	if len(arr) > 2 {
		how, _ = arr[2].(string)
	}
	return now, verdict, how
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
	var b strings.Builder
	keyspace.Write(&b, lim.prefix, keyspace.Tag(key), "f", lockKind) // one allocation
	s := b.String()
	cut := (len(s) + len("f") - len(lockKind)) / 2 // the two keys differ only in kind
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
