package mutex

import (
	"crypto/rand"
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
	// WithAutoRenew, so that a holder that died frees it within a lease.
	MaxTTL = 24 * time.Hour
)

// A Locker hands out locks on names, kept in one Redis deployment (a single
// server, a failover group or a cluster). The zero value is not usable; call
// New. A Locker is safe for concurrent use and has no Close: it starts a
// goroutine only while one of its Lock or Semaphore Acquire calls waits (to
// hear of releases and grants), while commands of overlapping calls queue
// (see below), and one per lock or permit taken with WithAutoRenew. Share one
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
	// releases numbers this Locker's releases for their records (retrysafety.go).
	releases *releases
	// honours is set when the client bounds commands by their context's
	// deadline (ContextTimeoutEnabled): an attempt's unknown outcome is then
	// remembered (retrysafety.go). runner sends the Locker's lone scripts: from
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

	// batch sends the commands of overlapping calls together (send.go),
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
	// (retrysafety.go).
	orphans orphans
	// spent are the orphans' tokens its handles released, looked for on
	// the lock in case their abandoned attempt runs late (retrysafety.go).
	spent spent
}

// New returns a Locker that keeps its locks through client. A nil client or
// a bad option is an error matching ErrInvalid (and the client an error
// matching ErrUnsupported when it cannot do what an option asks).
func New(client Client, opts ...Option) (*Locker, error) {
	if nilcheck.IsNil(client) {
		return nil, fmt.Errorf("%w: nil client", ErrInvalid)
	}
	l := &Locker{client: client, dep: single{}, prefix: DefaultPrefix, ttl: DefaultTTL, retry: DefaultRetryInterval, notify: true, releases: newReleases()}
	if err := l.configure(nil, inNew, opts); err != nil {
		return nil, err
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

// names are the strings one token's lock on one name needs: its keys and
// the value a fresh lock takes. They are cut from one string, built in one
// allocation, since every acquisition needs a new set.
type names struct {
	key   string // the lock: Key(name, "lock")
	fkey  string // the fencing counter, Key(name, "fence"); "" without fencing
	nkey  string // the name's release record, Key(name, "record")
	tkey  string // the token's release record, Key(name, "record:<token>")
	token string // tokenLen hex digits of random bits
	value string // the lock's value while nobody waits for it (putFreeValue)
}

// names returns the names of a new token's lock on name.
func (l *Locker) names(name string) names {
	var raw [tokenLen / 2]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails (Go 1.24+)
	tag := keyspace.Tag(name)
	base := len(l.prefix) + len(tag) + 3 // <prefix>{<tag>}:
	size := base + len("lock") + base + len("record:") + tokenLen + freeLen
	if l.fenceTTL > 0 {
		size += base + len("fence")
	}
	var b strings.Builder
	b.Grow(size)
	writeBase(&b, l.prefix, tag)
	b.WriteString("lock")
	keyEnd := b.Len()
	if l.fenceTTL > 0 {
		writeBase(&b, l.prefix, tag)
		b.WriteString("fence")
	}
	fenceEnd := b.Len()
	writeBase(&b, l.prefix, tag)
	b.WriteString("record")
	recordEnd := b.Len()
	// ":" and the token end the token's record key; the value follows.
	var tail [1 + tokenLen + freeLen]byte
	tail[0] = ':'
	putFreeValue(tail[1+tokenLen:], raw[:])
	copy(tail[1:1+tokenLen], tokenOf(tail[1+tokenLen:]))
	b.Write(tail[:])
	s := b.String()
	tokenEnd := len(s) - freeLen
	n := names{
		key:   s[:keyEnd],
		nkey:  s[fenceEnd:recordEnd],
		tkey:  s[fenceEnd:tokenEnd],
		token: s[recordEnd+1 : tokenEnd],
		value: s[tokenEnd:],
	}
	if fenceEnd > keyEnd {
		n.fkey = s[keyEnd:fenceEnd]
	}
	return n
}

// writeBase writes <prefix>{<tag>}: to b, the start of every key of a name.
func writeBase(b *strings.Builder, prefix, tag string) {
	b.WriteString(prefix)
	b.WriteByte('{')
	b.WriteString(tag)
	b.WriteString("}:")
}

// Client is the part of a go-redis client that a Locker needs: running
// scripts. *redis.Client (including the one NewFailoverClient returns),
// *redis.ClusterClient, *redis.Ring and any redis.UniversalClient satisfy it,
// and so does a small wrapper that counts calls or injects faults.
type Client interface {
	redis.Scripter
}

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = (*redis.Ring)(nil)
	_ Client = redis.UniversalClient(nil)
)
