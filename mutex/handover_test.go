package mutex_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// waitFor polls cond until it holds; the bound only stops a hang.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestLocalWaitersAreFIFO(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b, mutex.WithRetryInterval(time.Millisecond))
		holder, err := l.Lock(ctx, "fifo")
		if err != nil {
			t.Fatal(err)
		}
		const n = 12 // more than one hand-over chain
		var mu sync.Mutex
		var order []int
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				lk, err := l.Lock(ctx, "fifo")
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				if err := lk.Unlock(ctx); err != nil {
					t.Errorf("waiter %d Unlock: %v", i, err)
				}
			})
			waitFor(t, "waiter to queue", func() bool { return mutex.QueueLen(l, "fifo") == i+1 })
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		for i, got := range order {
			if got != i {
				t.Fatalf("acquisition order %v, want 0..%d in order", order, n-1)
			}
		}
		if len(order) != n {
			t.Fatalf("%d of %d waiters acquired", len(order), n)
		}
	})
}

// With one Locker, hand-over passes the lock in the script that releases it:
// at most 1.5 commands per acquisition, polls included.
func TestHandOverCommandsPerAcquisition(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c := b.Client(t)
		hook := &counter{}
		c.AddHook(hook)
		l := mustNew(t, c, mutex.WithPrefix(b.Prefix))
		const goroutines, each = 16, 50
		var wg sync.WaitGroup
		var inside atomic.Int32
		for range goroutines {
			wg.Go(func() {
				for range each {
					lk, err := l.Lock(ctx, "hot")
					if err != nil {
						t.Error(err)
						return
					}
					if inside.Add(1) != 1 {
						t.Error("two holders at once")
					}
					inside.Add(-1)
					if err := lk.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		acq := float64(goroutines * each)
		per := float64(hook.cmds.Load()) / acq
		t.Logf("%.0f acquisitions, %d commands, %.3f commands per acquisition", acq, hook.cmds.Load(), per)
		if per > 1.5 {
			t.Fatalf("%.3f commands per acquisition, want <= 1.5", per)
		}
	})
}

// A lock that went away before its holder's Unlock is not handed over: the
// failed hand-over leaves the new owner's lock alone, and the local waiter
// gets the lock later through the release notification of the new owner.
func TestHandOverOfALostLock(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		// Waiters of l poll only hourly and the stale lease lasts an hour:
		// only a hand-over or a notification can move them.
		lc := b.Client(t)
		hook := &counter{}
		lc.AddHook(hook)
		l := mustNew(t, lc, mutex.WithPrefix(b.Prefix), mutex.WithTTL(time.Hour), mutex.WithRetryInterval(time.Hour))
		stale, err := l.Lock(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *mutex.Lock, 1)
		go func() {
			// A lease longer than what the stale lock has left: the hand-over
			// must go through Redis, which finds the lock gone.
			lk, err := l.Lock(ctx, "x", mutex.WithTTL(2*time.Hour))
			if err != nil {
				t.Error(err)
			}
			got <- lk
		}()
		// The stale holder's Lock was the Locker's first, so a script (the
		// Locker makes sure scripts run before it takes native SETs). The
		// waiter tries once before queueing (a SET NX), once at the head of
		// the queue, subscribes, and tries once more: after that it waits an
		// hour unless told otherwise.
		waitFor(t, "the waiter's three attempts", func() bool { return hook.sets.Load() == 1 && hook.evals.Load() == 3 })
		// The stale holder loses its lock (no release is published) and
		// another process takes it.
		if err := c.Del(ctx, b.Prefix+"{x}:lock").Err(); err != nil {
			t.Fatal(err)
		}
		thief, err := newLocker(t, b).TryLock(ctx, "x", mutex.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := stale.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("Unlock of the lost lock = %v, want ErrNotHeld", err)
		}
		if ttl, err := thief.TTL(ctx); err != nil || ttl < 50*time.Second {
			t.Fatalf("the failed hand-over touched the new holder: %v, %v", ttl, err)
		}
		// The woken waiter marks the thief's lock; give it time to do so.
		waitFor(t, "waiter's mark", func() bool { return mutex.Marked(c.Get(ctx, b.Prefix+"{x}:lock").Val()) })
		if err := thief.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case lk := <-got:
			if lk == nil {
				t.Fatal("waiter got no lock")
			}
			lk.Unlock(ctx)
		case <-time.After(10 * time.Second):
			t.Fatal("the local waiter never got the lock")
		}
	})
}

func TestCancelledWaiterLeavesTheQueue(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b, mutex.WithRetryInterval(time.Millisecond))
		holder, err := l.Lock(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := l.Lock(wctx, "x")
			errc <- err
		}()
		waitFor(t, "waiter to queue", func() bool { return mutex.QueueLen(l, "x") == 1 })
		cancel()
		if err := <-errc; !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter = %v", err)
		}
		if n := mutex.QueueLen(l, "x"); n != 0 {
			t.Fatalf("queue holds %d after the waiter left", n)
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// Free, though perhaps not at once: an attempt the waiter had in
		// flight when it left (it polls every millisecond, on a client that
		// ignores deadlines) may land after the Unlock and take the lock for
		// nobody; its late reply releases it.
		waitFor(t, "the lock free after Unlock with no waiters", func() bool {
			lk, err := l.TryLock(ctx, "x")
			if err != nil && !errors.Is(err, mutex.ErrLocked) {
				t.Fatal(err)
			}
			return err == nil && lk.Unlock(ctx) == nil
		})
	})
}
