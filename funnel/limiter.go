package funnel

import (
	_ "embed"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/internal/nilcheck"
	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// Defaults and limits of a Limiter.
const (
	DefaultPrefix = mutex.DefaultPrefix
	// DefaultLease is the lease of the lock around one read-modify-write.
	DefaultLease = time.Second
	// MaxKeyLen is the longest key accepted, in bytes.
	MaxKeyLen = mutex.MaxNameLen
	// maxCommits bounds the retries of a commit whose lock lapsed.
	maxCommits = 8
)

var (
	// readStateFunc is read.lua's functions, which every script that reads
	// the state starts with (read.lua says how).
	//go:embed read.lua
	readStateFunc string
	//go:embed write.lua
	writeSrc string
	//go:embed reset.lua
	resetSrc  string
	readAlone = readStateFunc + "return read_state(#ARGV)\n"

	readGate  = mutex.NewGate(readAlone)     // Allow: deny without the lock
	readAll   = mutex.NewFragment(readAlone) // Refund: always take the lock
	readPeek  = redis.NewScript(readAlone)   // Peek, a crowded key: no lock
	writeBack = mutex.NewFragment(writeSrc)
	resetAll  = mutex.NewFragment(resetSrc)
)

// A Limiter decides calls against rules kept in Redis, one hash per key, at
// the cost the package documentation gives. The zero value is not usable;
// call New. A Limiter is safe for concurrent use.
type Limiter struct {
	locker *mutex.Locker
	prefix string
	hold   []mutex.Option // mutex.WithTTL(lease) (and WithAckAtRelease), made once
	// dial connects as the client does (nil for a cluster or a ring): a
	// release after its call left waits for it to connect.
	dial outage.Dial

	compiled memo[Rule, rule]
	sets     memo[setKey, *ruleSet]

	batches batches
	// joins is how many batches a call may join before it leads one of its
	// own: maxReruns, 0 WithoutBatching.
	joins   int
	turns   turns
	uniform bool // no one-script admission (WithUniformCost)

	denials *denyCache  // nil when off
	states  *stateCache // nil when off
	penalty []any       // WithPenalty's denials, window and box (µs); nil without

	acks       int // WithReplicaAck's, for the Limiter's own Locker
	ackTimeout time.Duration

	lockKeys bool        // the Locker's lock keys are built as keys builds them
	clock    serverClock // bounds the writes of calls with a deadline
}

// An Option configures a Limiter in New.
type Option func(*Limiter) error

// WithLocker makes the Limiter lock keys with l, which must use the same
// Redis, instead of a Locker of its own; a lock's name is its key. A quorum
// Locker cannot run the funnel's scripts.
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
		lim.hold = []mutex.Option{mutex.WithTTL(d)}
		return nil
	}
}

// WithoutBatching makes every admission take the key's lock for itself.
// By default, the concurrent admissions of one key with the same rules in
// one Limiter share one lock hold; the outcomes are the same either way.
func WithoutBatching() Option {
	return func(lim *Limiter) error {
		lim.joins = 0
		return nil
	}
}

// WithDenyCache turns on the local deny cache of maxKeys keys (1 to
// MaxDenyCache; off by default). After Redis denies a call, the key's calls
// with the same rules, in the same order, and at least as many units are
// denied in this process with that denial's Result, its waits counting
// down, until the moment Redis said the call would be admitted (never
// later, on clocks that run at the same rate). A hit does not look at ctx.
// A Refund or Reset through this Limiter clears the key's entry; a change
// made elsewhere takes effect here at that moment at the latest. Calls of
// more than 4 rules, or past the first 256 rule sets, are not cached.
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
// (DefaultStateCache if unset; 0 turns it off, at most MaxStateCache): a
// returning key whose state in Redis is still the one remembered is
// admitted in one round trip while its lock is free. The decisions are the
// same either way.
func WithStateCache(maxKeys int) Option {
	return func(lim *Limiter) error {
		switch {
		case maxKeys < 0 || maxKeys > MaxStateCache:
			return fmt.Errorf("%w: state cache of %d keys: want 0 to %d", ErrInvalidOption, maxKeys, MaxStateCache)
		case maxKeys == 0:
			lim.states = nil
		default:
			lim.states = newStateCache(maxKeys)
		}
		return nil
	}
}

// WithUniformCost makes every admission take the key's lock, and turns the
// state cache off: no admission takes one round trip, so a caller timing
// the answers cannot tell a key with state (a phone number that was sent
// codes) from one without.
func WithUniformCost() Option {
	return func(lim *Limiter) error {
		lim.uniform = true
		return nil
	}
}

// WithReplicaAck makes every admission's commit, and every write that
// grants or keeps a key's lock, wait until n replicas acknowledged it, for
// at most timeout (mutex.WithReplicaAck; with WithLocker, set it on that
// Locker). An admission whose commit was not acknowledged returns an error
// matching mutex.ErrNotReplicated; its charge stands on the master. Every
// admission then takes the lock (WithUniformCost).
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
	lim := &Limiter{prefix: DefaultPrefix, hold: []mutex.Option{mutex.WithTTL(DefaultLease)}, dial: outage.DialOf(client)}
	lim.clock.base = time.Now()
	lim.batches.open, lim.joins = make(map[batchKey]*batch), maxReruns
	lim.states = newStateCache(DefaultStateCache)
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(lim); err != nil {
			return nil, err
		}
	}
	if err := lim.wireLocker(client); err != nil {
		return nil, err
	}
	if n, _ := lim.locker.ReplicaAck(); n > 0 {
		// The commit's WAIT covers the acquisition: nothing is acted on before it.
		lim.hold = append(lim.hold, mutex.WithAckAtRelease())
		lim.uniform = true // admit.lua's write would wait for no replica
	}
	lim.lockKeys = lim.locker.LockKey("{a}~") == keyspace.Key(lim.prefix, "{a}~", lockKind) // the prefix and the escaping
	return lim, nil
}

// wireLocker makes the Limiter's own Locker, unless WithLocker gave one,
// which must then wait for the replicas WithReplicaAck asks for.
func (lim *Limiter) wireLocker(client mutex.Client) error {
	if lim.locker != nil {
		if n, d := lim.locker.ReplicaAck(); lim.acks > 0 && (n != lim.acks || d != lim.ackTimeout) {
			return fmt.Errorf("%w: WithReplicaAck(%d, %v) with a Locker that waits for %d replicas within %v: set it on the Locker", ErrInvalidOption, lim.acks, lim.ackTimeout, n, d)
		}
		return nil
	}
	lopts := []mutex.Option{mutex.WithPrefix(lim.prefix)}
	if lim.acks > 0 {
		lopts = append(lopts, mutex.WithReplicaAck(lim.acks, lim.ackTimeout))
	}
	l, err := mutex.New(client, lopts...)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	lim.locker = l
	return nil
}

// Locker returns the Locker that the Limiter locks keys with: its own, or
// WithLocker's.
func (lim *Limiter) Locker() *mutex.Locker {
	if lim == nil {
		return nil
	}
	return lim.locker
}
