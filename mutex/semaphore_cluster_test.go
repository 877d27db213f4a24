package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// TestClusterSemaphore: on a Redis Cluster, semaphores on names of several
// slots (braces in names included) count permits, and a waiter on one
// Locker is woken holding its permits by another's release (the grant's
// Pub/Sub message crosses the cluster).
func TestClusterSemaphore(t *testing.T) {
	c := testutil.Cluster(t)
	ctx := context.Background()
	prefix := c.Prefix(t)
	a := mustNew(t, c.Client(t), mutex.WithPrefix(prefix), mutex.WithRetryInterval(10*time.Second))
	b := mustNew(t, c.Client(t), mutex.WithPrefix(prefix), mutex.WithRetryInterval(10*time.Second))
	for _, name := range append(braceNames, "plain", "other") {
		sa, sb := mustSem(t, a, name, 2), mustSem(t, b, name, 2)
		p, err := sa.TryAcquire(ctx, 2)
		if err != nil {
			t.Fatalf("%q: TryAcquire: %v", name, err)
		}
		if _, err := sb.TryAcquire(ctx, 1); !errors.Is(err, mutex.ErrNoPermits) {
			t.Fatalf("%q: TryAcquire on a full semaphore: %v", name, err)
		}
		got := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 3*time.Second) // polls every 10 to 20 s
			defer cancel()
			q, err := sb.Acquire(wctx, 1, mutex.WithTTL(time.Minute))
			if err == nil {
				err = q.Release(ctx)
			}
			got <- err
		}()
		cl := c.Client(t)
		for cl.ZCard(ctx, mutex.SemKey(sb, "sem:queue")).Val() != 1 {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // subscribed
		if err := p.Release(ctx); err != nil {
			t.Fatalf("%q: Release: %v", name, err)
		}
		if err := <-got; err != nil {
			t.Fatalf("%q: the waiter on another Locker: %v", name, err)
		}
	}
}
