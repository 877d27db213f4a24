package mutex

import (
	"context"
	"time"

	"github.com/funnelguard/funnelguard/internal/keyspace"
)

// QueueLen returns how many goroutines of l wait for name (a test seam).
func QueueLen(l *Locker, name string) int { return l.Waiters(name) }

// Marked reports whether a lock's stored value carries a waiter's mark (a
// test seam: the format is value.go's).
func Marked(value string) bool { return waitMarked(value) }

// FreeValue returns the value that a fresh lock of some token takes (a test
// seam: the format is value.go's).
func FreeValue() string {
	var v [freeLen]byte
	putFreeValue(v[:], make([]byte, tokenLen/2))
	return string(v[:])
}

// BatchSlots is how many commands or pipelines of a Locker may be in flight.
const BatchSlots = batchSlots

// BatchQueued returns how many commands of l wait for a pipeline.
func BatchQueued(l *Locker) int {
	l.batch.mu.Lock()
	defer l.batch.mu.Unlock()
	return len(l.batch.queue)
}

// BatchBusy returns how many slots of l are in use.
func BatchBusy(l *Locker) int {
	l.batch.mu.Lock()
	defer l.batch.mu.Unlock()
	return l.batch.busy
}

// InternalKey is Key without its refusal of the Locker's own kinds, for
// tests that look at the Locker's keys ("record", "fence").
func InternalKey(l *Locker, name, kind string) string {
	return keyspace.Key(l.prefix, name, kind)
}

// SemEnqueue queues a waiter for n permits of s that never polls again: a
// waiter whose process died. It returns the waiter's token.
func SemEnqueue(ctx context.Context, s *Semaphore, n int64) (string, error) {
	tok := newSemToken()
	cfg, err := s.check(ctx, n, nil)
	if err != nil {
		return "", err
	}
	_, err = s.acquireOnce(ctx, tok, n, cfg, "w")
	return tok, err
}

// SemKey returns the key of kind ("sem", "sem:ends", "sem:queue"...) of s.
func SemKey(s *Semaphore, kind string) string { return keyspace.Key(s.l.prefix, s.name, kind) }

// PermitDeadline returns when p's lost signal is due (its Done closes), on
// the local clock.
func PermitDeadline(p *Permit) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deadline()
}

// SemRelease runs the release script for tok, a token of s (SemEnqueue's).
func SemRelease(ctx context.Context, s *Semaphore, tok string) (int64, error) {
	return SemReleaseFor(ctx, s, tok, recordTTL)
}

// SemTake runs the acquire script for a new token of s in TryAcquire's mode
// with the given lease, and returns the token and whether it holds n
// permits: a holder that may never release (no Permit, no renewal).
func SemTake(ctx context.Context, s *Semaphore, n int64, lease time.Duration) (string, bool, error) {
	tok := newSemToken()
	cfg, err := s.check(ctx, n, []Option{WithTTL(lease)})
	if err != nil {
		return "", false, err
	}
	r, err := s.acquireOnce(ctx, tok, n, cfg, "t")
	return tok, err == nil && r[0] == semGranted, err
}

// SemReleaseFor is SemRelease whose record of tok lasts record (the
// Permits' records last recordTTL).
func SemReleaseFor(ctx context.Context, s *Semaphore, tok string, record time.Duration) (int64, error) {
	reply, err := s.l.run(ctx, semReleaseScript, s.keys, []any{tok, s.channel, record.Milliseconds(), ""}, nil)
	if err != nil {
		return 0, err
	}
	return integer(reply)
}

// MaxChain is how many local hand-overs in a row a lock makes before the next
// goes through Redis.
const MaxChain = maxChain
