package mutex

import (
	"context"
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
	// MaxTTL is the longest lease and retry interval accepted: renew a lock
	// held longer (WithAutoRenew), so that a dead holder frees it in a lease.
	MaxTTL = 24 * time.Hour
)

// A Locker hands out locks on names, kept in one Redis deployment (a server,
// a failover group or a cluster) or, from NewQuorum, on a quorum of them.
// Use New; the zero value is not usable. A Locker is safe for concurrent use
// and has no Close: share one per process. Its waiters for a name queue in
// FIFO order (PROTOCOL.md, "Contention").
type Locker struct {
	client   Client
	prefix   string
	retry    time.Duration
	fenceTTL time.Duration // 0: no fencing
	notify   bool          // release notifications: not WithoutNotifications, and the client subscribes (wire)
	dep      deployment    // single (New) or *quorum (NewQuorum)
	evalErr  error         // Eval's refusal on dep, nil where it runs
	defaults lockConfig    // an acquisition's without options, made once (box)
	fenceMS  any           // fenceTTL in ms, boxed once for the scripts
	// setNX takes a free lock with SET NX PX [GET] (takeFree); nil when the
	// Locker needs the script.
	setNX              redis.StringCmdable
	scripted, noSetGet atomic.Bool
	releases           *releases // numbers releases for their records (retrysafety.go)
	// honours: the client bounds commands by ctx's deadline, so an unknown
	// outcome is remembered, not undone late (retrysafety.go).
	honours    bool
	runner     ctxcall.Runner
	dial       outage.Dial // the client's dialer (nil: not a *redis.Client), for releaseOrphan
	acks       int         // WithReplicaAck; 0: no WAIT
	ackTimeout time.Duration

	batch   batcher // send.go
	noBatch bool    // WithoutPipelining

	mu     sync.Mutex
	queues map[string]*queue // waiters by name
	// nqueues is len(queues), read without mu on the uncontended path.
	nqueues atomic.Int64
	sub     *subscription // release notifications; nil while nobody waits

	orphans orphans // retrysafety.go
	spent   spent
}

// New returns a Locker that keeps its locks through client. A nil client or
// a bad option is an error matching ErrInvalid, an option the client cannot
// serve one matching ErrUnsupported.
func New(client Client, opts ...Option) (*Locker, error) {
	if nilcheck.IsNil(client) {
		return nil, fmt.Errorf("%w: nil client", ErrInvalid)
	}
	l, err := newLocker(client, nil, opts)
	if err != nil {
		return nil, err
	}
	if err := l.checkAcks(); err != nil {
		return nil, err
	}
	l.wire()
	return l, nil
}

// wire picks how the Locker talks to its client.
func (l *Locker) wire() {
	l.honours = ctxcall.Honours(l.client)
	l.runner = ctxcall.NewRunner(l.client)
	l.dial = outage.DialOf(l.client)
	_, subscribes := l.client.(subscriber)
	l.notify = l.notify && subscribes
	if s, ok := l.runner.Scripter().(redis.StringCmdable); ok && l.fenceTTL == 0 && l.acks == 0 {
		l.setNX = s
	}
	if p, ok := l.client.(interface{ Pipeline() redis.Pipeliner }); ok && !l.noBatch {
		l.batch.pipe = p.Pipeline
		_, l.batch.fanOut = l.client.(interface{ Options() *redis.Options })
	}
}

// Key returns <prefix>{<name>}:<kind>, a key in the lock's cluster slot for
// a Fragment's data. A reserved or empty kind or a bad name is ErrInvalid.
func (l *Locker) Key(name, kind string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	if reservedKind(kind) {
		return "", fmt.Errorf("%w: key kind %q is the Locker's own", ErrInvalid, kind)
	}
	return keyspace.Key(l.prefix, name, kind), nil
}

// LockKey returns the key of the lock on name, for a Fragment that only
// reads it and for monitoring. Never write it.
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

func reservedKind(kind string) bool {
	switch kind {
	case "", kindLock, kindFence, kindRecord, kindReleased, kindSem:
		return true
	}
	return strings.HasPrefix(kind, kindRecord+":") || strings.HasPrefix(kind, kindSem+":")
}

// Client is the part of a go-redis client that a Locker needs: running
// scripts. *redis.Client, *redis.ClusterClient, *redis.Ring and
// redis.UniversalClient satisfy it.
type Client interface {
	redis.Scripter
}

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = (*redis.Ring)(nil)
	_ Client = redis.UniversalClient(nil)
)

// Eval runs script, which takes no lock, as the Locker sends its own
// commands, returning by ctx's end on any client. For a caller's script on
// its locks' keys, such as one that checks a lock is free (LockKey).
func (l *Locker) Eval(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	switch {
	case ctx == nil:
		return nil, ErrNilContext
	case l == nil:
		return nil, errNilLocker
	case script == nil:
		return nil, fmt.Errorf("%w: Eval of a nil script", ErrInvalid)
	}
	if l.evalErr != nil {
		return nil, l.evalErr
	}
	return l.run(ctx, script, keys, args, nil)
}
