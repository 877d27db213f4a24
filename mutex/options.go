package mutex

import (
	"fmt"
	"math"
	"time"

	"github.com/funnelguard/funnelguard/internal/keyspace"
)

// An Option configures a Locker, given to New or NewQuorum, or one
// acquisition, given to TryLock, Lock, TryLockWith, LockWith and a
// Semaphore's TryAcquire and Acquire. Each option's doc says where it
// applies; given anywhere else it makes the call fail with ErrInvalid, as a
// bad value does. Options are values: make one once and pass it to every
// call. The zero Option changes nothing.
type Option struct{ o *option }

type option struct {
	name  string
	where place
	err   error                        // a bad value, reported wherever it is given
	setup func(*Locker, *quorum) error // in New (q is nil) or NewQuorum
	call  lockConfig                   // in an acquisition
}

// place is a set of the places an option applies.
type place uint8

const (
	inNew place = 1 << iota
	inQuorum
	inCall
)

func (p place) String() string {
	switch p {
	case inNew:
		return "New"
	case inQuorum:
		return "NewQuorum"
	}
	return "an acquisition"
}

// lockConfig is what the options of one acquisition decide.
type lockConfig struct {
	ttl      time.Duration
	ttlMS    any // ttl in ms, boxed once for the scripts' arguments
	renew    bool
	ackLater bool // WithAckAtRelease
	err      error
}

// check refuses o where it means nothing.
func (o *option) check(at place) error {
	switch {
	case o.err != nil:
		return o.err
	case o.where&at == 0:
		return fmt.Errorf("%w: %s is not an option of %v", ErrInvalid, o.name, at)
	}
	return nil
}

// configure applies the options of New (q nil) or NewQuorum.
func (l *Locker) configure(q *quorum, at place, opts []Option) error {
	for _, o := range opts {
		if o.o == nil {
			continue
		}
		if err := o.o.check(at); err != nil {
			return err
		}
		if err := o.o.setup(l, q); err != nil {
			return err
		}
	}
	return nil
}

// config validates a call and its options.
func (l *Locker) config(name string, opts []Option) (lockConfig, error) {
	if l == nil {
		return lockConfig{}, errNilLocker
	}
	if err := checkName(name); err != nil {
		return lockConfig{}, err
	}
	cfg := lockConfig{ttl: l.ttl, ttlMS: l.ttlMS}
	for _, o := range opts {
		if o.o != nil {
			cfg.add(o.o)
		}
	}
	return cfg, cfg.err
}

// add applies one option; the last bad one is the call's error.
func (cfg *lockConfig) add(o *option) {
	if err := o.check(inCall); err != nil {
		cfg.err = err
		return
	}
	if o.call.ttl > 0 {
		cfg.ttl, cfg.ttlMS = o.call.ttl, o.call.ttlMS
	}
	cfg.renew = cfg.renew || o.call.renew
	cfg.ackLater = cfg.ackLater || o.call.ackLater
}

// checkDuration refuses a lease or interval (what names it) under 1 ms,
// the scripts' unit, or over MaxTTL.
func checkDuration(what string, d time.Duration) error {
	if d < time.Millisecond || d > MaxTTL {
		return fmt.Errorf("%w: %s %v: want 1ms to %v", ErrInvalid, what, d, MaxTTL)
	}
	return nil
}

// lockerOption is an option of New and NewQuorum.
func lockerOption(name string, set func(*Locker)) Option {
	return Option{&option{name: name, where: inNew | inQuorum, setup: func(l *Locker, _ *quorum) error {
		set(l)
		return nil
	}}}
}

// WithTTL sets the lease: given to New or NewQuorum, of every lock
// (DefaultTTL if unset); given to an acquisition, of that lock or permit
// alone. A holder that neither unlocks nor extends loses the lock when the
// lease ends. It is kept in whole milliseconds and must be 1 ms to MaxTTL.
func WithTTL(d time.Duration) Option {
	o := &option{name: "WithTTL", where: inNew | inQuorum | inCall, err: checkDuration("lease", d)}
	o.call = lockConfig{ttl: d, ttlMS: d.Milliseconds()}
	o.setup = func(l *Locker, _ *quorum) error {
		l.ttl = d
		return nil
	}
	return Option{o}
}

// WithRetryInterval sets the mean time between two attempts of a waiting
// Lock (DefaultRetryInterval if unset). Each wait is drawn uniformly from
// [d/2, 3d/2) so that waiters spread out, and is cut short when the
// holder's lease ends sooner or its release is announced. It must be 1 ms
// to MaxTTL. An option of New and NewQuorum.
func WithRetryInterval(d time.Duration) Option {
	o := lockerOption("WithRetryInterval", func(l *Locker) { l.retry = d })
	o.o.err = checkDuration("retry interval", d)
	return o
}

// WithoutPipelining sends each call's commands on their own, never in a
// pipeline with those of overlapping calls (see Locker): one connection of
// the client's pool per call in flight, as with other Redis lock libraries.
// An option of New and NewQuorum.
func WithoutPipelining() Option {
	return lockerOption("WithoutPipelining", func(l *Locker) { l.noBatch = true })
}

// WithPrefix sets the prefix of the Redis keys (DefaultPrefix if unset). A
// lock on name is stored at <prefix>{<name>}:lock, with braces and '~' in
// the name escaped, so every key of one name shares a cluster slot. An
// option of New and NewQuorum.
func WithPrefix(prefix string) Option {
	o := lockerOption("WithPrefix", func(l *Locker) { l.prefix = prefix })
	if err := keyspace.CheckPrefix(prefix); err != nil {
		o.o.err = fmt.Errorf("%w: prefix: %w", ErrInvalid, err)
	}
	return o
}

// WithoutNotifications turns release notifications off. By default, while
// a Lock waits, the Locker subscribes to the name's release channel (one
// Redis Pub/Sub connection per Locker, only while someone waits), and a
// release that a waiter asked for publishes one message, so the waiter
// tries at once instead of at its next tick. Notifications only speed
// things up: without them, or when one is lost, the next tick acquires the
// lock. A client without Subscribe gets no notifications, and neither does
// a quorum. An option of New and NewQuorum.
func WithoutNotifications() Option {
	return lockerOption("WithoutNotifications", func(l *Locker) { l.notify = false })
}

// WithFencing gives every acquisition a fencing number (Lock.Fence),
// strictly greater than the numbers of all earlier acquisitions of the
// name, for resources outside Redis that can reject a stale holder's
// writes.
//
// The counter lives at <prefix>{<name>}:fence and expires DefaultFenceTTL
// after its last use, so idle names cost nothing. Each number is at least
// the Redis server's time in microseconds, so a counter created again after
// it expired continues above every number it gave before, unless the
// server's clock was set back by more than DefaultFenceTTL meanwhile. It
// costs no extra round trip: it is part of the acquire script.
//
// An option of New only: a quorum has no one Redis to keep the counter.
func WithFencing() Option {
	o := lockerOption("WithFencing", func(l *Locker) { l.fenceTTL = DefaultFenceTTL })
	o.o.where = inNew
	return o
}

// WithReplicaAck makes every write that grants or keeps a lock wait until
// at least n replicas of the key's master have acknowledged it, for at most
// timeout (Redis's WAIT, on the connection that made the write): see
// REPLICAS.md for what each call does when too few acknowledge
// (ErrNotReplicated) and what the guarantee is worth in a failover.
//
// It needs a client whose connections can be held: *redis.Client (also from
// NewFailoverClient) or *redis.ClusterClient; New refuses any other with
// ErrUnsupported. Keep timeout below the client's ReadTimeout. n must be at
// least 1 and timeout at least a millisecond (ErrInvalid). An option of New
// only: each node of a quorum is its own master.
func WithReplicaAck(n int, timeout time.Duration) Option {
	o := lockerOption("WithReplicaAck", func(l *Locker) { l.acks, l.ackTimeout = n, timeout })
	o.o.where = inNew
	switch {
	case n < 1 || n > math.MaxInt32:
		o.o.err = fmt.Errorf("%w: replica acknowledgement by %d replicas: want at least 1", ErrInvalid, n)
	case timeout < time.Millisecond:
		o.o.err = fmt.Errorf("%w: replica acknowledgement within %v: want at least 1ms", ErrInvalid, timeout)
	}
	return o
}

// quorumOption is an option of NewQuorum only.
func quorumOption(name, what string, d time.Duration, set func(*quorum)) Option {
	o := &option{name: name, where: inQuorum, setup: func(_ *Locker, q *quorum) error {
		set(q)
		return nil
	}}
	if d < time.Millisecond {
		o.err = fmt.Errorf("%w: %s %v: want at least 1ms", ErrInvalid, what, d)
	}
	return Option{o}
}

// WithNodeTimeout bounds each node's part of a quorum call
// (DefaultNodeTimeout if unset, or the TTL/10 when that is less). Keep it
// far below the lease: the time an acquisition takes comes off the lease's
// validity. An option of NewQuorum only.
func WithNodeTimeout(d time.Duration) Option {
	return quorumOption("WithNodeTimeout", "node timeout", d, func(q *quorum) { q.timeout = d })
}

// WithRejoinDelay keeps a node out of every majority for d after it started
// empty. Each node keeps a marker, <prefix>quorum:up, with the server time
// it was first seen; a node without one (restarted without persistence, or
// idle for DefaultFenceTTL) refuses to grant locks until d has passed on
// its clock. Make d longer than the longest lease, so that every lock the
// node forgot has expired on the others. The marker costs a few commands
// per acquisition and no extra round trip; a brand-new deployment waits d
// before its first lock. An option of NewQuorum only.
func WithRejoinDelay(d time.Duration) Option {
	return quorumOption("WithRejoinDelay", "rejoin delay", d, func(q *quorum) { q.rejoin = d })
}

// WithAutoRenew keeps the lease of a lock or permit alive while it is
// held: every lease/3 a goroutine extends it with a token-checked script.
// Renewal stops in Unlock, before Unlock returns. If the lock is found
// taken, or renewals fail until the lease must have ended, the lock is
// lost: Done closes, Context is cancelled with cause ErrLockLost, and
// Unlock returns ErrNotHeld. It never acquires the lock again on its own.
// An option of an acquisition.
func WithAutoRenew() Option { return autoRenew }

var autoRenew = Option{&option{name: "WithAutoRenew", where: inCall, call: lockConfig{renew: true}}}

// WithAckAtRelease makes an acquisition of a Locker made WithReplicaAck
// wait for no replica: the UnlockWith that ends the hold waits for them
// instead, and its acknowledgement covers the acquisition too (a replica
// acknowledges a master's writes in their order). It suits holds whose only
// effect is the fragment written at release, such as the funnel's
// read-modify-write; a hold that acts outside Redis needs its acquisition
// acknowledged. A lock granted this way can be lost in a failover before
// the release, which then finds it gone (ErrNotHeld). Without
// WithReplicaAck it changes nothing. An option of an acquisition.
func WithAckAtRelease() Option { return ackAtRelease }

var ackAtRelease = Option{&option{name: "WithAckAtRelease", where: inCall, call: lockConfig{ackLater: true}}}
