package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// A ledger is the test's account of held permits: every grant adds an
// entry, a release removes it before Release is called, and an abandoned
// permit (its holder "crashed") counts until its lost signal is due (the
// deadline at which its Done closes, read when it is abandoned, not when
// its timer runs): the sum of n over holders whose lost signal has not
// fired. A deadline later than the server's end of the lease shows as an
// overlap with the permits' next grant.
type ledger struct {
	mu      sync.Mutex
	size    int64
	held    map[*mutex.Permit]ledgerEntry
	worst   int64
	grants  int
	crashed int
}

type ledgerEntry struct {
	n     int64
	until time.Time // zero: until released
}

// grant records p, granted to a call sent at sent, and reports the permits
// counted as held then, p's included.
func (g *ledger) grant(p *mutex.Permit) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	sum := p.N()
	for q, e := range g.held {
		if !e.until.IsZero() && !now.Before(e.until) {
			delete(g.held, q)
			continue
		}
		sum += e.n
	}
	g.held[p] = ledgerEntry{n: p.N()}
	g.grants++
	g.worst = max(g.worst, sum)
	return sum
}

func (g *ledger) release(p *mutex.Permit) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.held, p)
}

func (g *ledger) abandon(p *mutex.Permit) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held[p] = ledgerEntry{n: p.N(), until: mutex.PermitDeadline(p)}
	g.crashed++
}

// TestSemaphoreCounting: 64 goroutines on 4 Lockers (4 clients: as many
// processes to Redis) take random weights of a semaphore of 5 and hold
// them briefly (a third of them with TryAcquire); some abandon their permits (a crash: they come back at
// their lease). Nowhere are more than 5 permits held: by the ledger (grants
// as the holders see them, crashed holders counted to their lease) and by
// a counter in Redis that each live holder raises by its weight inside its
// hold and checks.
func TestSemaphoreCounting(t *testing.T) {
	b := testutil.RealBackend(t)
	const size, workers, rounds = 5, 64, 6
	lease := 250 * time.Millisecond
	var sems []*mutex.Semaphore
	for range 4 {
		sems = append(sems, mustSem(t, newLocker(t, b, mutex.WithRetryInterval(10*time.Millisecond)), "count", size))
	}
	rc := b.Client(t)
	counter := b.Prefix + "{count}:test-counter"
	g := &ledger{size: size, held: map[*mutex.Permit]ledgerEntry{}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			err := countingWorker(ctx, sems[w%len(sems)], rc, counter, g, rounds, lease, w)
			if err != nil {
				cancel() // the others stop at once, not at their deadline
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	t.Logf("%d grants, %d abandoned, at most %d of %d permits held at once", g.grants, g.crashed, g.worst, size)
	if g.worst > size {
		t.Errorf("%d permits held at once, semaphore of %d", g.worst, size)
	}
}

func countingWorker(ctx context.Context, s *mutex.Semaphore, rc *redis.Client, counter string, g *ledger, rounds int, lease time.Duration, w int) error {
	for r := range rounds {
		n := 1 + rand.Int64N(s.Size())
		crash := (w+r)%17 == 0
		l := 10 * time.Second // a live holder's lease does not end in its hold
		if crash {
			l = lease
		}
		p, err := take(ctx, s, n, l, w%3 == 0)
		if err != nil {
			return fmt.Errorf("worker %d: Acquire(%d): %w", w, n, err)
		}
		if sum := g.grant(p); sum > s.Size() {
			_ = p.Release(context.Background())
			return fmt.Errorf("worker %d: granted %d with %d held in all, semaphore of %d", w, n, sum, s.Size())
		}
		if crash { // never release, never decrement
			g.abandon(p)
			continue
		}
		v, err := rc.IncrBy(ctx, counter, n).Result()
		if err != nil {
			return err
		}
		if v > s.Size() {
			return fmt.Errorf("worker %d: counter at %d inside a hold, semaphore of %d", w, v, s.Size())
		}
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		if err := rc.DecrBy(ctx, counter, n).Err(); err != nil {
			return err
		}
		g.release(p)
		if err := p.Release(ctx); err != nil {
			return fmt.Errorf("worker %d: Release: %w", w, err)
		}
	}
	return nil
}

// take is Acquire, or TryAcquire until it succeeds (the path that grants
// with an empty queue).
func take(ctx context.Context, s *mutex.Semaphore, n int64, lease time.Duration, try bool) (*mutex.Permit, error) {
	if !try {
		return s.Acquire(ctx, n, mutex.WithTTL(lease))
	}
	for {
		p, err := s.TryAcquire(ctx, n, mutex.WithTTL(lease))
		if !errors.Is(err, mutex.ErrNoPermits) {
			return p, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(1+rand.IntN(5)) * time.Millisecond):
		}
	}
}
