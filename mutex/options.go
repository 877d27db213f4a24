package mutex

import (
	"cmp"
	"fmt"
	"math"
	"time"

	"github.com/funnelguard/funnelguard/internal/keyspace"
)

// An Option configures a Locker (New, NewQuorum) or one acquisition; each
// option's doc says where it applies. Given elsewhere, or with a bad value,
// it fails the call with ErrInvalid. The zero Option changes nothing.
type Option struct{ o *option }

type option struct {
	name  string
	where place
	err   error                  // a bad value, reported wherever it is given
	setup func(*Locker, *quorum) // in New (q is nil) or NewQuorum
	call  lockConfig             // in an acquisition
}

type place uint8

const (
	inNew place = 1 << iota
	inQuorum
	inCall

	inLocker = inNew | inQuorum
)

// placeNames name the places in an error.
var placeNames = [...]string{inNew: "New", inQuorum: "NewQuorum", inCall: "an acquisition"}

type lockConfig struct {
	ttl      time.Duration
	ttlMS    any // ttl in ms, boxed once for the scripts' arguments
	renew    bool
	ackLater bool // WithAckAtRelease
}

func (o *option) check(at place) error {
	switch {
	case o.err != nil:
		return o.err
	case o.where&at == 0:
		return fmt.Errorf("%w: %s is not an option of %s", ErrInvalid, o.name, placeNames[at])
	}
	return nil
}

// newLocker returns a Locker on client, kept on q (nil: one Redis).
func newLocker(client Client, q *quorum, opts []Option) (*Locker, error) {
	l := &Locker{client: client, dep: single{}, prefix: DefaultPrefix, defaults: lockConfig{ttl: DefaultTTL}, retry: DefaultRetryInterval, notify: true, releases: newReleases()}
	at := inNew
	if q != nil {
		// notify stays false: a quorum's releases announce nothing.
		l.dep, l.notify, at = q, false, inQuorum
	}
	for _, o := range opts {
		if o.o == nil {
			continue
		}
		if err := o.o.check(at); err != nil {
			return nil, err
		}
		o.o.setup(l, q)
	}
	l.defaults.ttlMS = l.defaults.ttl.Milliseconds()
	l.fenceMS = l.fenceTTL.Milliseconds()
	l.evalErr = l.dep.unsupported("Eval")
	l.queues = make(map[string]*queue)
	return l, nil
}

// options is an acquisition's configuration given opts (none: l.defaults);
// the last bad one is the error.
func (l *Locker) options(opts []Option) (cfg lockConfig, err error) {
	cfg = l.defaults
	for _, o := range opts {
		if o.o == nil {
			continue
		}
		if e := o.o.check(inCall); e != nil {
			err = e
			continue
		}
		c := o.o.call // what it sets: the rest is zero
		cfg.ttl, cfg.ttlMS = cmp.Or(c.ttl, cfg.ttl), cmp.Or(c.ttlMS, cfg.ttlMS)
		cfg.renew = cmp.Or(c.renew, cfg.renew)
		cfg.ackLater = cmp.Or(c.ackLater, cfg.ackLater)
	}
	return cfg, err
}

// checkDuration refuses a lease or interval under 1 ms or over MaxTTL.
func checkDuration(what string, d time.Duration) error {
	if d < time.Millisecond || d > MaxTTL {
		return fmt.Errorf("%w: %s %v: want 1ms to %v", ErrInvalid, what, d, MaxTTL)
	}
	return nil
}

func atLeastMS(what string, d time.Duration) error {
	if d < time.Millisecond {
		return fmt.Errorf("%w: %s %v: want at least 1ms", ErrInvalid, what, d)
	}
	return nil
}

// setting returns a constructor option; err is a bad value's.
func setting(name string, where place, err error, set func(*Locker, *quorum)) Option {
	return Option{&option{name: name, where: where, err: err, setup: set}}
}

// WithTTL sets the lease of every lock (given to New or NewQuorum; DefaultTTL
// if unset) or of one acquisition: 1 ms to MaxTTL, in whole milliseconds.
func WithTTL(d time.Duration) Option {
	o := setting("WithTTL", inLocker|inCall, checkDuration("lease", d), func(l *Locker, _ *quorum) { l.defaults.ttl = d })
	o.o.call = lockConfig{ttl: d, ttlMS: d.Milliseconds()}
	return o
}

// WithRetryInterval sets the mean time between two attempts of a waiting
// Lock (DefaultRetryInterval if unset), each drawn from [d/2, 3d/2): 1 ms to
// MaxTTL. An option of New and NewQuorum.
func WithRetryInterval(d time.Duration) Option {
	return setting("WithRetryInterval", inLocker, checkDuration("retry interval", d), func(l *Locker, _ *quorum) { l.retry = d })
}

// WithoutPipelining sends each call's commands on their own, never in a
// pipeline with those of overlapping calls. An option of New and NewQuorum.
func WithoutPipelining() Option {
	return setting("WithoutPipelining", inLocker, nil, func(l *Locker, _ *quorum) { l.noBatch = true })
}

// WithPrefix sets the prefix of the Redis keys (DefaultPrefix if unset): a
// lock on name is at <prefix>{<name>}:lock. An option of New and NewQuorum.
func WithPrefix(prefix string) Option {
	err := keyspace.CheckPrefix(prefix)
	if err != nil {
		err = fmt.Errorf("%w: prefix: %w", ErrInvalid, err)
	}
	return setting("WithPrefix", inLocker, err, func(l *Locker, _ *quorum) { l.prefix = prefix })
}

// WithoutNotifications turns off release notifications over Pub/Sub, which
// only wake a waiting Lock early. An option of New and NewQuorum.
func WithoutNotifications() Option {
	return setting("WithoutNotifications", inLocker, nil, func(l *Locker, _ *quorum) { l.notify = false })
}

// WithFencing gives every acquisition a fencing number (Lock.Fence) greater
// than those of all earlier acquisitions of the name, for resources outside
// Redis that can reject a stale holder's writes. An option of New only.
func WithFencing() Option {
	return setting("WithFencing", inNew, nil, func(l *Locker, _ *quorum) { l.fenceTTL = DefaultFenceTTL })
}

// WithReplicaAck makes every write that grants or keeps a lock wait, up to
// timeout, until n replicas acknowledged it (WAIT); too few fail the call
// with ErrNotReplicated (PROTOCOL.md, "Replicas"). It needs a *redis.Client
// or *redis.ClusterClient (else New fails with ErrUnsupported), n >= 1 and
// timeout >= 1 ms, below the client's ReadTimeout. An option of New only.
func WithReplicaAck(n int, timeout time.Duration) Option {
	err := atLeastMS("replica acknowledgement within", timeout)
	if n < 1 || n > math.MaxInt32 {
		err = fmt.Errorf("%w: replica acknowledgement by %d replicas: want at least 1", ErrInvalid, n)
	}
	return setting("WithReplicaAck", inNew, err, func(l *Locker, _ *quorum) { l.acks, l.ackTimeout = n, timeout })
}

// WithNodeTimeout bounds each node's part of a quorum call
// (DefaultNodeTimeout if unset, or the TTL/10 when that is less). An option
// of NewQuorum only.
func WithNodeTimeout(d time.Duration) Option {
	return setting("WithNodeTimeout", inQuorum, atLeastMS("node timeout", d), func(_ *Locker, q *quorum) { q.timeout = d })
}

// WithRejoinDelay keeps a node out of every majority for d after it started
// empty (no <prefix>quorum:up marker), so a brand-new deployment waits d
// before its first lock. Make d longer than the longest lease. An option of
// NewQuorum only.
func WithRejoinDelay(d time.Duration) Option {
	return setting("WithRejoinDelay", inQuorum, atLeastMS("rejoin delay", d), func(_ *Locker, q *quorum) { q.rejoin = d })
}

// WithAutoRenew keeps extending the lease until Unlock; a lock that renewal
// finds taken, or cannot renew in time, is lost (Done, Context). An option of
// an acquisition.
func WithAutoRenew() Option { return autoRenew }

var autoRenew = Option{&option{name: "WithAutoRenew", where: inCall, call: lockConfig{renew: true}}}

// WithAckAtRelease makes an acquisition wait for no replica: the UnlockWith
// that ends the hold waits and covers it too (PROTOCOL.md, "Replicas"). An
// option of an acquisition.
func WithAckAtRelease() Option { return ackAtRelease }

var ackAtRelease = Option{&option{name: "WithAckAtRelease", where: inCall, call: lockConfig{ackLater: true}}}
