package mutex

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/funnelguard/funnelguard/internal/keyspace"
)

// ErrNoPermits means a Semaphore's TryAcquire found too few free permits,
// or waiters queued before it (it never jumps the queue).
var ErrNoPermits = errors.New("mutex: not enough free permits")

// MaxSemaphoreSize is the largest size of a Semaphore, 2^53 - 1: its
// scripts count permits in Lua, whose numbers are doubles, exact up to
// that bound.
const MaxSemaphoreSize = 1<<53 - 1

// kindSem is the kind of a Semaphore's hash; the kinds of its other keys
// (semaphore.lua) and of its channel start with it.
const kindSem = "sem"

// A Semaphore is a counting semaphore of size permits on one name, kept in
// the Locker's Redis, in the shape of golang.org/x/sync/semaphore: holders
// take weighted, leased permits (TryAcquire, Acquire) and give them back
// (Permit.Release). Made by Locker.Semaphore; safe for concurrent use; it
// holds no connection and starts no goroutine until a call waits.
//
// Whatever the processes, the permits held (the sum of n over the Permits
// whose Done has not closed) never exceed the size; a permit neither
// released nor extended comes back when its lease ends, on the server's
// clock. Waiters are served in FIFO order across processes: a release
// grants the head waiters that now fit, in order, and stops at the first
// that does not, so a large request is not starved. Every key has a TTL,
// and all share the name's hash slot.
//
// On a quorum Locker (NewQuorum) an acquisition needs SemaphoreQuorum nodes,
// not a majority, and Acquire polls instead of queueing (no FIFO; Fence is
// 0). With WithReplicaAck every acquisition and extension waits for the
// replicas as a lock's does (else ErrNotReplicated, and a grant is given
// back). RELIABILITY.md has the measurements and the quorum's table.
type Semaphore struct {
	l       *Locker
	name    string
	size    int64
	dep     semDeployment // single, or semQuorum on a quorum Locker
	keys    []string      // semaphore.lua's KEYS
	channel string        // where grants to waiters are announced
}

// Semaphore returns the semaphore of size permits on name. Every Semaphore
// of one name must have the same size: an acquisition under another size
// than the one Redis keeps for a semaphore in use fails with ErrInvalid (the
// size may change once the name has been idle long enough for its keys to
// expire). A bad name or a size under 1 or over MaxSemaphoreSize is an
// error matching ErrInvalid; a quorum Locker made WithRejoinDelay cannot
// keep semaphores (ErrUnsupported; see Semaphore for quorums and replica
// acknowledgement).
func (l *Locker) Semaphore(name string, size int64) (*Semaphore, error) {
	if l == nil {
		return nil, errNilLocker
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if size < 1 || size > MaxSemaphoreSize {
		return nil, fmt.Errorf("%w: semaphore size %d: want 1 to %d", ErrInvalid, size, int64(MaxSemaphoreSize))
	}
	dep, err := l.dep.semaphores(size)
	if err != nil {
		return nil, err
	}
	key := func(kind string) string { return keyspace.Key(l.prefix, name, kind) }
	keys := []string{key(kindSem), key(kindSem + ":ends"), key(kindSem + ":queue")}
	return &Semaphore{l: l, name: name, size: size, dep: dep, keys: keys, channel: key(kindSem + ":granted")}, nil
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Size returns the number of permits of the semaphore.
func (s *Semaphore) Size() int64 { return s.size }

// TryAcquire takes n permits if they are free now and nobody waits for
// permits before it; it returns ErrNoPermits otherwise, and leaves the
// semaphore unchanged. It takes one round trip (one to every node at once on
// a quorum, where too many failed nodes make an error matching ErrNoQuorum,
// and an acquisition too slow for its lease too). n must be 1 to Size
// (ErrInvalid). The options are a lock's: WithTTL (the Locker's TTL if
// unset) and WithAutoRenew.
func (s *Semaphore) TryAcquire(ctx context.Context, n int64, opts ...Option) (*Permit, error) {
	cfg, err := s.check(ctx, n, opts)
	if err != nil {
		return nil, err
	}
	return s.dep.semTry(ctx, s, newSemToken(), n, cfg)
}

// semTry is TryAcquire on one Redis: one run of the acquire script.
func (single) semTry(ctx context.Context, s *Semaphore, tok string, n int64, cfg lockConfig) (*Permit, error) {
	start := time.Now()
	r, err := s.acquireOnce(ctx, tok, n, cfg, "t")
	switch {
	case err != nil:
		return nil, err
	case r[0] != semGranted:
		return nil, ErrNoPermits
	}
	return s.newPermit(tok, n, cfg, start, r[1], r[2], r[3]), nil
}

func (s *Semaphore) check(ctx context.Context, n int64, opts []Option) (lockConfig, error) {
	if ctx == nil {
		return lockConfig{}, ErrNilContext
	}
	if s == nil {
		return lockConfig{}, fmt.Errorf("%w: nil Semaphore", ErrInvalid)
	}
	cfg, err := s.l.options(opts) // s.name was checked by Locker.Semaphore
	if err == nil && (n < 1 || n > s.size) {
		err = fmt.Errorf("%w: %d permits of a semaphore of %d", ErrInvalid, n, s.size)
	}
	return cfg, err
}

// acquireOnce runs semaphore_acquire.lua for tok; its reply is {granted,
// server now, lease end, fence} or {waiting, server now}. With replica
// acknowledgement (WithReplicaAck) WAIT follows in the same round trip, and
// a grant that too few replicas acknowledged is an error matching
// ErrNotReplicated. Then, or when its outcome is unknown, it gives back
// what tok may hold (cancel).
func (s *Semaphore) acquireOnce(ctx context.Context, tok string, n int64, cfg lockConfig, mode string) ([]int64, error) {
	args := []any{tok, n, s.size, cfg.ttl.Milliseconds(), mode, s.waitLease().Milliseconds(), s.channel}
	reply, short, err := s.l.runWithAck(ctx, semAcquireScript, s.keys, args, false, false, nil)
	if err != nil {
		if unknownOutcome(err) {
			s.cancel(ctx, tok)
		}
		return nil, opErr("semaphore", s.name, err)
	}
	r, err := semNums(reply)
	switch {
	case err != nil:
		return nil, err
	case r[0] == semBadSize:
		return nil, fmt.Errorf("%w: semaphore %q has size %d in Redis, not %d", ErrInvalid, s.name, r[1], s.size)
	case r[0] == semEnded:
		return nil, fmt.Errorf("%w: semaphore %q: token ended", ErrNotHeld, s.name)
	case r[0] == semGranted && len(r) < 4:
		return nil, fmt.Errorf("%w: %v", ErrUnexpectedReply, reply)
	case r[0] == semGranted && short != nil:
		s.cancel(ctx, tok)
		return nil, opErr("semaphore", s.name, short)
	}
	return r, nil
}

// newPermit returns the Permit of tok's n permits, granted by a script sent
// at start whose reply said the server's time was now and the lease ends at
// ends (both server ms).
func (s *Semaphore) newPermit(tok string, n int64, cfg lockConfig, start time.Time, now, ends, fence int64) *Permit {
	p := &Permit{s: s, token: tok, n: n, fence: fence}
	// The server read now after start: the lease lasts ends-now from start.
	p.sent, p.lease = start, time.Duration(ends-now)*time.Millisecond
	if cfg.renew {
		p.startRenew(p, cfg.ttl)
	}
	return p
}

func semNums(reply any) ([]int64, error) {
	arr, ok := reply.([]any)
	if !ok || len(arr) < 2 {
		return nil, fmt.Errorf("%w: %T %v", ErrUnexpectedReply, reply, reply)
	}
	out := make([]int64, len(arr))
	for i, v := range arr {
		if out[i], ok = v.(int64); !ok {
			return nil, fmt.Errorf("%w: element %d is %T", ErrUnexpectedReply, i, v)
		}
	}
	return out, nil
}

// cancel takes tok out of the queue, or gives back the permits it was
// granted, and records it so that a late acquire of it takes nothing. It
// runs even when ctx was cancelled, bounded as Unlock is; the caller waits
// for it cancelWait at most (waitAtMost), which a healthy server answers
// well within. An error leaves the token to its wait lease or its permits'
// lease.
func (s *Semaphore) cancel(ctx context.Context, tok string) {
	waitAtMost(cancelWait, func() {
		ctx, stop := detach(ctx)
		defer stop()
		_, _ = s.dep.semRelease(ctx, s, tok, "c")
	})
}

// cancelWait is how long a call that gives up waits for its cancel: under
// the 20 ms in which a cancelled call returns on a stopped server (issue 42).
const cancelWait = 10 * time.Millisecond

// waitLease is how long a queued waiter keeps its place without polling:
// 3 retry intervals (saturated), one more than the longest pause between
// its polls (pollWait).
func (s *Semaphore) waitLease() time.Duration {
	return min(s.l.retry, math.MaxInt64/3) * 3
}

// newSemToken returns 128 random bits as hex: one acquisition's token.
func newSemToken() string {
	var raw [16]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(raw[:])
}
