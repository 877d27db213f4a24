package mutex

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/internal/keyspace"
)

// ErrNoPermits means a Semaphore's TryAcquire found too few free permits,
// or waiters queued before it (it never jumps the queue).
var ErrNoPermits = errors.New("mutex: not enough free permits")

// The kinds of key a Semaphore writes (semaphore.lua), and its channel.
const (
	kindSem        = "sem"
	kindSemHolders = "sem:holders"
	kindSemQueue   = "sem:queue"
	kindSemAlive   = "sem:alive"
	kindSemDone    = "sem:done"
	kindSemGranted = "sem:granted"
)

// semRecordTTL is how long a released or cancelled token is remembered
// (semaphore.lua's done set): a release run again within it answers as
// its first run, and a late acquire of the token takes nothing.
const semRecordTTL = recordTTL

// A Semaphore is a counting semaphore of size permits on one name, kept in
// the Locker's Redis, in the shape of golang.org/x/sync/semaphore: holders
// take weighted, leased permits (TryAcquire, Acquire) and give them back
// (Permit.Release). Made by Locker.Semaphore; safe for concurrent use, and
// cheap: it holds no connection and starts no goroutine until a call waits.
//
// Guarantees, whatever the processes: the permits held (the sum of n over
// the Permits whose Done has not closed) never exceed the size. A permit
// whose holder neither releases nor extends it comes back when its lease
// ends, on the server's clock. Waiters are served in FIFO order across
// processes: a release grants the head waiters, in order, as many as now
// fit, and stops at the first that does not, so a large request is not
// starved by small ones; a granted waiter wakes holding its permits (one
// Pub/Sub message, no further round trip). A waiter that stops polling (its
// process died) is passed over once its wait lease ends (see Acquire).
//
// Every key has a TTL (the latest lease, wait lease or release record it
// keeps, plus at most a quarter of that duration, so that most calls need
// not move it) and all of them share the name's hash slot:
// <prefix>{<name>}:sem and sem:holders, sem:queue, sem:alive, sem:done.
type Semaphore struct {
	l       *Locker
	name    string
	size    int64
	keys    []string // semaphore.lua's KEYS
	channel string   // where grants to waiters are announced
}

// Semaphore returns the semaphore of size permits on name. Every Semaphore
// of one name must have the same size: an acquisition under another size
// than the one Redis keeps for a semaphore in use fails with ErrInvalid (the
// size may change once the name has been idle long enough for its keys to
// expire). A bad name or a size under 1 is an error matching ErrInvalid; a
// quorum Locker (NewQuorum) or one made WithReplicaAck cannot keep
// semaphores (ErrUnsupported).
func (l *Locker) Semaphore(name string, size int64) (*Semaphore, error) {
	if l == nil {
		return nil, errNilLocker
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if size < 1 {
		return nil, fmt.Errorf("%w: semaphore size %d: want at least 1", ErrInvalid, size)
	}
	if l.q != nil || l.acks > 0 {
		return nil, fmt.Errorf("%w: a semaphore on a quorum or with replica acknowledgement", ErrUnsupported)
	}
	s := &Semaphore{l: l, name: name, size: size, channel: keyspace.Key(l.prefix, name, kindSemGranted)}
	for _, kind := range []string{kindSem, kindSemHolders, kindSemQueue, kindSemAlive, kindSemDone} {
		s.keys = append(s.keys, keyspace.Key(l.prefix, name, kind))
	}
	return s, nil
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Size returns the number of permits of the semaphore.
func (s *Semaphore) Size() int64 { return s.size }

// TryAcquire takes n permits if they are free now and nobody waits for
// permits before it; it returns ErrNoPermits otherwise, and leaves the
// semaphore unchanged. It takes one round trip. n must be 1 to Size
// (ErrInvalid). The options are a lock's: Lease (the Locker's TTL if
// unset) and AutoRenew.
func (s *Semaphore) TryAcquire(ctx context.Context, n int64, opts ...LockOption) (*Permit, error) {
	cfg, err := s.check(n, opts)
	if err != nil {
		return nil, err
	}
	tok := newSemToken()
	start := time.Now()
	r, err := s.acquireOnce(ctx, tok, n, cfg, "t")
	switch {
	case err != nil:
		if unknownOutcome(err) {
			s.cancel(ctx, tok) // it may have taken the permits: give them back
		}
		return nil, err
	case r[0] != semGranted:
		return nil, ErrNoPermits
	}
	return s.newPermit(tok, n, cfg, start, r[1], r[2], r[3]), nil
}

// check validates an acquisition.
func (s *Semaphore) check(n int64, opts []LockOption) (lockConfig, error) {
	if s == nil {
		return lockConfig{}, fmt.Errorf("%w: nil Semaphore", ErrInvalid)
	}
	cfg, err := s.l.config(s.name, opts)
	if err != nil {
		return cfg, err
	}
	if n < 1 || n > s.size {
		return cfg, fmt.Errorf("%w: %d permits of a semaphore of %d", ErrInvalid, n, s.size)
	}
	return cfg, nil
}

// acquireOnce runs semaphore_acquire.lua for tok; its reply is {granted,
// server now, lease end, fence} or {waiting, server now}.
func (s *Semaphore) acquireOnce(ctx context.Context, tok string, n int64, cfg lockConfig, mode string) ([]int64, error) {
	args := []any{tok, n, s.size, cfg.ttl.Milliseconds(), mode, s.waitLease().Milliseconds(), s.channel}
	reply, err := s.l.run(ctx, semAcquireScript, s.keys, args, nil)
	if err != nil {
		return nil, fmt.Errorf("mutex: semaphore %q: %w", s.name, err)
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
	}
	return r, nil
}

// cancel takes tok out of the queue, or gives back the permits it was
// granted, and records it so that a late acquire of it takes nothing. It
// runs even when ctx was cancelled, bounded as Unlock is, but the caller
// waits for it dropWait at most (as for a dropped lock), so that a call
// returns by its deadline plus that margin on a hung server too. An error
// leaves the token to its wait lease or its permits' lease.
func (s *Semaphore) cancel(ctx context.Context, tok string) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, stop := detach(ctx)
		defer stop()
		_, _ = s.l.run(ctx, semReleaseScript, s.keys, []any{tok, s.channel, semRecordTTL.Milliseconds(), "c"}, nil)
	}()
	t := time.NewTimer(dropWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// waitLease is how long a queued waiter keeps its place without polling:
// 20 retry intervals, at least a second. A waiter polls 4 times within it
// (a lost grant message is found by the next poll); a dead waiter is
// passed over when it ends.
func (s *Semaphore) waitLease() time.Duration {
	return max(20*s.l.retry, time.Second)
}

// newSemToken returns 128 random bits as hex: one acquisition's token.
func newSemToken() string {
	var raw [16]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(raw[:])
}
