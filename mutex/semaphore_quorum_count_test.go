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
)

// TestSemaphoreQuorumCounting: a semaphore of 2 on a quorum of 3 nodes
// (Q = 3), 24 goroutines over 3 Lockers (3 sets of clients: as many
// processes) taking 1 or 2 permits with TryAcquire or Acquire and holding
// them briefly, through faults: node 0 frozen (SIGSTOP) for longer than
// the node timeout, then, while two long holders fill the semaphore, node
// 1 and then node 2 killed and restarted empty. By the ledger (grants as
// the holders see them), never more than 2 permits are held. With a
// majority (Q = 2) the restarts let a third holder in: node 0 keeps the
// long holders, nodes 1 and 2 have forgotten them and grant a majority.
func TestSemaphoreQuorumCounting(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and freezes servers: seconds")
	}
	srvs := testutil.StartServers(t, 3)
	prefix := testutil.NewPrefix()
	var sems []*mutex.Semaphore
	for range 3 {
		l, err := mutex.NewQuorum(newClients(t, srvs), mutex.WithPrefix(prefix), mutex.WithNodeTimeout(300*time.Millisecond), mutex.WithRetryInterval(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		sems = append(sems, mustSem(t, l, "count", 2))
	}
	g := &ledger{size: 2, held: map[*mutex.Permit]ledgerEntry{}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wctx, stop := context.WithCancel(ctx) // the workers' run
	errs := make(chan error, 32)
	var wg sync.WaitGroup
	for w := range 24 {
		wg.Go(func() {
			if err := quorumWorker(wctx, sems[w%3], g, w); err != nil {
				cancel()
				errs <- err
			}
		})
	}
	quorumFaults(t, ctx, srvs, sems[0], g)
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d grants, at most %d of 2 permits held at once", g.grants, g.worst)
	if g.worst > 2 {
		t.Errorf("%d permits held at once, semaphore of 2", g.worst)
	}
}

// quorumFaults runs the faults of TestSemaphoreQuorumCounting while the
// workers run.
func quorumFaults(t *testing.T, ctx context.Context, srvs []*testutil.Server, s *mutex.Semaphore, g *ledger) {
	pause := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	pause(1500 * time.Millisecond)
	thaw := testutil.Freeze(t, srvs[0].Pid())
	pause(time.Second)
	thaw()
	pause(500 * time.Millisecond)
	// Two long holders fill the semaphore and stay through both restarts.
	var long []*mutex.Permit
	for len(long) < 2 && ctx.Err() == nil {
		p, err := s.Acquire(ctx, 1, mutex.WithTTL(time.Minute))
		if errors.Is(err, mutex.ErrNoQuorum) {
			continue // a node still slow after the thaw
		}
		if err != nil {
			t.Fatalf("long holder: %v", err)
		}
		if sum := g.grant(p); sum > 2 {
			t.Errorf("long holder granted with %d held", sum)
		}
		long = append(long, p)
	}
	for _, i := range []int{1, 2} {
		pause(300 * time.Millisecond)
		if err := srvs[i].Restart(); err != nil {
			t.Fatalf("restart node %d: %v", i, err)
		}
	}
	pause(time.Second)
	for _, p := range long {
		g.release(p)
		_ = p.Release(ctx) // nodes 1 and 2 forgot it: ErrNotHeld
	}
	pause(1500 * time.Millisecond)
}

// quorumWorker takes and releases permits until ctx ends, counting its
// grants in g; a refusal for want of nodes (ErrNoQuorum) is tried again.
// A lease of 1.5 s: a Release that a frozen or dead node fails leaves the
// permits held on the others until it ends.
func quorumWorker(ctx context.Context, s *mutex.Semaphore, g *ledger, w int) error {
	for ctx.Err() == nil {
		n := 1 + rand.Int64N(2)
		p, err := take(ctx, s, n, 1500*time.Millisecond, w%2 == 0)
		switch {
		case errors.Is(err, mutex.ErrNoQuorum):
			time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
			continue
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("worker %d: acquire %d: %w", w, n, err)
		}
		if sum := g.grant(p); sum > s.Size() {
			return fmt.Errorf("worker %d: granted %d with %d held in all, semaphore of %d", w, n, sum, s.Size())
		}
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		g.release(p)
		_ = p.Release(ctx) // with a node down: ErrNoQuorum, the permits end at their lease
	}
	return nil
}
