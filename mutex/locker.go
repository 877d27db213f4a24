package mutex

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/internal/nilcheck"
	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/redis/go-redis/v9"
)

// Defaults and limits of a Locker.
const (
	DefaultTTL           = 10 * time.Second
	DefaultRetryInterval = 50 * time.Millisecond
	DefaultPrefix        = "fg:"
	// DefaultFenceTTL is how long a fencing counter outlives its last use.
	DefaultFenceTTL = 7 * 24 * time.Hour
	// MaxNameLen is the longest lock name accepted, in bytes.
	MaxNameLen = 1024
	// MaxTTL is the longest lease (WithTTL, Lease, Extend) and retry
	// interval accepted: a lock meant to outlive a day is held with
	// AutoRenew, so that a holder that died frees it within a lease.
	MaxTTL = 24 * time.Hour
)

// checkDuration refuses a lease or interval (what names it) under 1 ms,
// the scripts' unit, or over MaxTTL.
func checkDuration(what string, d time.Duration) error {
	if d < time.Millisecond || d > MaxTTL {
		return fmt.Errorf("%w: %s %v: want 1ms to %v", ErrInvalid, what, d, MaxTTL)
	}
	return nil
}

// A Locker hands out locks on names, kept in one Redis deployment (a single
// server, a failover group or a cluster). The zero value is not usable; call
// New. A Locker is safe for concurrent use and has no Close: it starts a
// goroutine only while one of its Lock or Semaphore Acquire calls waits (to
// hear of releases and grants), while commands of overlapping calls queue
// (see below), and one per lock or permit taken with AutoRenew. Share one
// Locker among the goroutines of a process.
//
// Calls of one Locker that overlap share round trips: commands queued
// while others are in flight go to Redis as one pipeline, each call still
// getting its own reply by its own deadline (WithoutPipelining turns it
// off). Goroutines of one Locker waiting for one name queue in FIFO order,
// only the head polling Redis; an Unlock passes the lock to the next of
// them, with no round trip while enough of the lease is left, and now and
// then releases it to all comers so that waiters in other processes are
// not starved (PROTOCOL.md gives the figures). A hand-over without a round
// trip trusts the lease Redis confirmed to the chain's first holder: the
// chain never outlives it, but does not notice a lock deleted behind its
// back (a FLUSHALL) before it ends. Lock.UnlockWith checks in Redis all the
// same; WithFencing turns those hand-overs off.
type Locker struct {
	client   Client
	prefix   string
	ttl      time.Duration
	retry    time.Duration
	fenceTTL time.Duration // 0: no fencing
	notify   bool
	dep      deployment // single (New) or *quorum (NewQuorum)
	ttlMS    any        // ttl in ms and fenceTTL in ms, boxed once for the scripts
	fenceMS  any
	// setNX takes a free lock with a native SET NX PX GET; nil when the
	// client has none, or the Locker needs the script (fencing, a quorum).
	// It is used only once a script has run (scripted), and never on a
	// server without SET NX GET (noSetGet).
	setNX              nativeSetter
	scripted, noSetGet atomic.Bool
	// releases numbers this Locker's releases for their records (stamp.go).
	releases *releases
	// honours is set when the client bounds commands by their context's
	// deadline (ContextTimeoutEnabled): an attempt's unknown outcome is then
	// remembered (orphans.go). runner sends the Locker's lone scripts: from
	// the caller's goroutine when the command ends by ctx's end, else under
	// ctxcall (a client without the option, or a ctx that can be cancelled
	// before its deadline).
	honours bool
	runner  ctxcall.Runner
	dial    outage.Dial // the client's dialer (nil: not a *redis.Client), for releaseOrphan
	// acks replicas must acknowledge each write that grants or keeps a
	// lock within ackTimeout (WithReplicaAck); 0: no WAIT.
	acks       int
	ackTimeout time.Duration

	// batch sends the commands of overlapping calls together (batch.go),
	// unless noBatch (WithoutPipelining).
	batch   batcher
	noBatch bool

	mu     sync.Mutex
	queues map[string]*queue // waiters by name
	// nqueues is len(queues), written under mu: a Locker nobody waits on
	// skips mu and the map on the uncontended path (queued, nextWaiter,
	// released).
	nqueues atomic.Int64
	sub     *subscription // release notifications; nil while nobody waits

	// orphans are the tokens of attempts whose caller left before the reply
	// (orphans.go).
	orphans orphans
	// spent are the orphans' tokens its handles released, looked for on
	// the lock in case their abandoned attempt runs late (spent.go).
	spent spent
}

// An Option configures a Locker made by New: a CommonOption, WithFencing
// or WithReplicaAck.
type Option interface {
	applyLocker(*Locker) error
}

// A QuorumOption configures a Locker made by NewQuorum: a CommonOption,
// WithNodeTimeout or WithRejoinDelay. The options a quorum cannot honour
// (WithFencing, WithReplicaAck) are not QuorumOptions, and the quorum's own
// are not Options, so the compiler refuses either where it does not fit.
type QuorumOption interface {
	applyQuorum(*Locker, *quorum) error
}

// A CommonOption configures a Locker made by New or by NewQuorum.
type CommonOption func(*Locker) error

func (o CommonOption) applyLocker(l *Locker) error            { return o.apply(l) }
func (o CommonOption) applyQuorum(l *Locker, _ *quorum) error { return o.apply(l) }

func (o CommonOption) apply(l *Locker) error {
	if o == nil {
		return nil
	}
	return o(l)
}

// lockerOption is an Option that only New accepts.
type lockerOption func(*Locker) error

func (o lockerOption) applyLocker(l *Locker) error { return o(l) }

// WithTTL sets the default lease of a lock (DefaultTTL if unset). A holder
// that neither unlocks nor extends loses the lock when the lease ends. The
// lease is kept in whole milliseconds; it must be 1 ms to MaxTTL.
func WithTTL(d time.Duration) CommonOption {
	return func(l *Locker) error {
		if err := checkDuration("lease", d); err != nil {
			return err
		}
		l.ttl = d
		return nil
	}
}

// WithRetryInterval sets the mean time between two attempts of a waiting Lock
// (DefaultRetryInterval if unset). Each wait is drawn uniformly from
// [d/2, 3d/2) so that waiters spread out, and is cut short when the holder's
// lease ends sooner or its release is announced. It must be 1 ms to MaxTTL.
func WithRetryInterval(d time.Duration) CommonOption {
	return func(l *Locker) error {
		if err := checkDuration("retry interval", d); err != nil {
			return err
		}
		l.retry = d
		return nil
	}
}

// WithoutPipelining sends each call's commands on their own, never in a
// pipeline with those of overlapping calls (see Locker): one connection of
// the client's pool per call in flight, as with other Redis lock libraries.
func WithoutPipelining() CommonOption {
	return func(l *Locker) error {
		l.noBatch = true
		return nil
	}
}

// WithPrefix sets the prefix of the Redis keys (DefaultPrefix if unset). A
// lock on name is stored at <prefix>{<name>}:lock, with braces and '~' in the
// name escaped, so every key of one name shares a cluster slot.
func WithPrefix(prefix string) CommonOption {
	return func(l *Locker) error {
		if err := keyspace.CheckPrefix(prefix); err != nil {
			return fmt.Errorf("%w: prefix: %w", ErrInvalid, err)
		}
		l.prefix = prefix
		return nil
	}
}

// WithoutNotifications turns release notifications off. By default, while
// a Lock waits, the Locker subscribes to the name's release channel (one
// Redis Pub/Sub connection per Locker, only while someone waits), and a
// release that a waiter asked for publishes one message, so the waiter tries
// at once instead of at its next tick. Notifications only speed things up:
// without them, or when one is lost, the next tick acquires the lock. A
// client without Subscribe gets no notifications, and neither does a quorum.
func WithoutNotifications() CommonOption {
	return func(l *Locker) error {
		l.notify = false
		return nil
	}
}

// WithFencing gives every acquisition a fencing number (Lock.Fence), strictly
// greater than the numbers of all earlier acquisitions of the name, for
// resources outside Redis that can reject a stale holder's writes.
//
// The counter lives at <prefix>{<name>}:fence and expires DefaultFenceTTL
// after its last use, so idle names cost nothing. Each number is at least the
// Redis server's time in microseconds, so a counter created again after it
// expired continues above every number it gave before, unless the server's
// clock was set back by more than DefaultFenceTTL meanwhile. Fencing costs no
// extra round trip: it is part of the acquire script.
//
// It is an Option of New only: a quorum has no one Redis to keep the counter.
func WithFencing() Option {
	return lockerOption(func(l *Locker) error {
		l.fenceTTL = DefaultFenceTTL
		return nil
	})
}

// New returns a Locker that keeps its locks through client. A nil client or
// a bad option is an error matching ErrInvalid (and the client an error
// matching ErrUnsupported when it cannot do what an option asks).
func New(client Client, opts ...Option) (*Locker, error) {
	if nilcheck.IsNil(client) {
		return nil, fmt.Errorf("%w: nil client", ErrInvalid)
	}
	l := &Locker{client: client, dep: single{}, prefix: DefaultPrefix, ttl: DefaultTTL, retry: DefaultRetryInterval, notify: true, releases: newReleases()}
	for _, o := range opts {
		if nilcheck.IsNil(o) {
			continue
		}
		if err := o.applyLocker(l); err != nil {
			return nil, err
		}
	}
	if err := l.checkAcks(); err != nil {
		return nil, err
	}
	l.box()
	l.wire()
	return l, nil
}

// wire picks the ways the Locker talks to its client: a native SET NX for
// free locks (not with fencing, and not with WithReplicaAck, where WAIT
// follows the acquire script in its pipeline), deadlines honoured by the
// client or by ctxcall, pipelines for overlapping calls.
func (l *Locker) wire() {
	l.honours = ctxcall.Honours(l.client)
	l.runner = ctxcall.NewRunner(l.client)
	l.dial = outage.DialOf(l.client)
	if s, ok := l.runner.Scripter().(nativeSetter); ok && l.fenceTTL == 0 && l.acks == 0 {
		l.setNX = s
	}
	if !l.noBatch {
		l.batch.pipe = pipelines(l.client)
		_, l.batch.fanOut = l.client.(interface{ Options() *redis.Options })
	}
}

// box keeps the script arguments that every call sends, boxed once.
func (l *Locker) box() {
	l.ttlMS, l.fenceMS = l.ttl.Milliseconds(), l.fenceTTL.Milliseconds()
}

// A LockOption configures one acquisition. Options are values: make one
// once and pass it to every call.
type LockOption *lockOption

type lockOption struct {
	ttl      time.Duration // 0: unchanged
	ttlMS    any           // ttl in ms, boxed once for the scripts' arguments
	renew    bool
	ackLater bool // AckAtRelease
	err      error
}

type lockConfig struct {
	ttl      time.Duration
	ttlMS    any
	renew    bool
	ackLater bool
	err      error
}

// Lease sets the lease of this acquisition instead of the Locker's TTL:
// 1 ms to MaxTTL, or the acquisition fails with ErrInvalid.
func Lease(d time.Duration) LockOption {
	if err := checkDuration("lease", d); err != nil {
		return &lockOption{err: err}
	}
	return &lockOption{ttl: d, ttlMS: d.Milliseconds()}
}

// AutoRenew keeps the lock's lease alive while it is held: every lease/3 a
// goroutine extends it with a token-checked script. Renewal stops in Unlock,
// before Unlock returns. If the lock is found taken, or renewals fail until
// the lease must have ended, the lock is lost: Done closes, Context is
// cancelled with cause ErrLockLost, and Unlock returns ErrNotHeld. It never
// acquires the lock again on its own.
func AutoRenew() LockOption { return autoRenew }

var autoRenew = &lockOption{renew: true}

// AckAtRelease makes an acquisition of a Locker made WithReplicaAck wait for
// no replica: the UnlockWith that ends the hold waits for them instead, and
// its acknowledgement covers the acquisition too (a replica acknowledges a
// master's writes in their order). It suits holds whose only effect is the
// fragment written at release, such as the funnel's read-modify-write,
// which acts on nothing before its commit; a hold that acts outside Redis
// needs its acquisition acknowledged. A lock granted this way can be lost in
// a failover before the release, which then finds it gone (ErrNotHeld).
// Without WithReplicaAck it changes nothing.
func AckAtRelease() LockOption { return ackAtRelease }

var ackAtRelease = &lockOption{ackLater: true}

// Key returns <prefix>{<name>}:<kind>, a key in the same Redis Cluster slot
// as the lock on name, for data that a Fragment reads or writes under that
// lock. Braces and '~' in name are escaped, as in the lock's own key, so the
// slot is the same whatever name holds. The kinds the Locker writes itself
// are refused with ErrInvalid: "lock", "fence", "record", "record:" followed
// by anything (release records), "released" (the release channel), and
// "sem" and "sem:" followed by anything (a Semaphore's keys and channel); so
// is an empty kind or a name Lock would refuse.
func (l *Locker) Key(name, kind string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	if reservedKind(kind) {
		return "", fmt.Errorf("%w: key kind %q is the Locker's own", ErrInvalid, kind)
	}
	return keyspace.Key(l.prefix, name, kind), nil
}

// checkName refuses a name no lock may have.
func checkName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: name of %d bytes: want 1 to %d", ErrInvalid, len(name), MaxNameLen)
	}
	return nil
}

// LockKey returns the key of the lock on name, for a Fragment that only
// reads it (EXISTS or PTTL: is the lock free, how long is left) and for
// monitoring. Never write it: its value's format is the Locker's.
func (l *Locker) LockKey(name string) string {
	return keyspace.Key(l.prefix, name, kindLock)
}

// The kinds of key the Locker writes itself.
const (
	kindLock     = "lock"
	kindFence    = "fence"
	kindRecord   = "record"
	kindReleased = "released"
)

// reservedKind reports whether Key must refuse kind.
func reservedKind(kind string) bool {
	switch kind {
	case "", kindLock, kindFence, kindRecord, kindReleased, kindSem:
		return true
	}
	return strings.HasPrefix(kind, kindRecord+":") || strings.HasPrefix(kind, kindSem+":")
}

// config validates a call and its options.
func (l *Locker) config(name string, opts []LockOption) (lockConfig, error) {
	if l == nil {
		return lockConfig{}, errNilLocker
	}
	if err := checkName(name); err != nil {
		return lockConfig{}, err
	}
	cfg := lockConfig{ttl: l.ttl, ttlMS: l.ttlMS}
	for _, o := range opts {
		if o != nil {
			cfg.add(o)
		}
	}
	return cfg, cfg.err
}

// add applies one option; the last bad one is the call's error.
func (cfg *lockConfig) add(o *lockOption) {
	switch {
	case o.err != nil:
		cfg.err = o.err
	case o.ttl > 0:
		cfg.ttl, cfg.ttlMS = o.ttl, o.ttlMS
	}
	cfg.renew = cfg.renew || o.renew
	cfg.ackLater = cfg.ackLater || o.ackLater
}
