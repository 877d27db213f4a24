package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// renewLease is the lease of the tests that need renewals to keep a lock:
// a renewal runs every lease/3 and must land before the lease ends, so a
// short lease would make the test one of the machine's speed (a renewal
// late by 200 ms under load loses a 300 ms lease).
const renewLease = time.Second

func TestAutoRenewKeepsTheLock(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		const lease = renewLease
		l := newLocker(t, b, mutex.WithTTL(lease))
		lk, err := l.Lock(ctx, "job", mutex.WithAutoRenew())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * lease)
		if closed(lk.Done()) {
			t.Fatalf("renewed lock reported lost: %v", context.Cause(lk.Context(ctx)))
		}
		if _, err := l.TryLock(ctx, "job"); !errors.Is(err, mutex.ErrLocked) {
			t.Fatalf("after 3 leases TryLock = %v, want ErrLocked", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock of a renewed lock = %v", err)
		}
		within(t, lk.Done(), hang, "Done after Unlock")
	})
}

func TestNoRenewalAfterUnlock(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		hook := &counter{}
		c.AddHook(hook)
		// Each hold lasts half a lease: long enough for a renewal (every
		// lease/3), short enough that the lease itself outlasts a stall.
		const lease = 400 * time.Millisecond
		l := mustNew(t, c, mutex.WithPrefix(b.Prefix), mutex.WithTTL(lease))
		for range 8 {
			lk, err := l.Lock(ctx, "job", mutex.WithAutoRenew())
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(lease / 2) // mid-way between renewals, some in flight
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		before := hook.extends.Load()
		if before == 0 {
			t.Fatal("no renewal ran while held: the counter cannot see them")
		}
		time.Sleep(2 * lease) // six renewal periods
		if after := hook.extends.Load(); after != before {
			t.Fatalf("%d renewals ran after Unlock returned", after-before)
		}
	})
}

func TestAutoRenewReportsDeletedKey(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		const lease = 60 * time.Millisecond
		lk, err := newLocker(t, b, mutex.WithTTL(lease)).Lock(ctx, "job", mutex.WithAutoRenew())
		if err != nil {
			t.Fatal(err)
		}
		owned := lk.Context(ctx)
		c.Del(ctx, b.Prefix+"{job}:lock")
		within(t, owned.Done(), hang, "Context after the key was deleted")
		if cause := context.Cause(owned); !errors.Is(cause, mutex.ErrLockLost) {
			t.Fatalf("cause = %v, want ErrLockLost", cause)
		}
		if err := lk.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("Unlock = %v, want ErrNotHeld", err)
		}
		// Never re-acquired behind the holder's back.
		if n := c.Exists(ctx, b.Prefix+"{job}:lock").Val(); n != 0 {
			t.Fatal("the lock was re-created after it was lost")
		}
	})
}

// The server stops during a renewed hold: loss is reported by the end of the
// lease the last renewal set, which is at most a lease after the stop; the
// bound adds half a lease for the deadline timer to be scheduled on a loaded
// machine. A loss reported a lease late, or never, fails.
func TestAutoRenewServerStopped(t *testing.T) {
	srv := testutil.StartServer(t)
	ctx := context.Background()
	const lease = renewLease
	l := mustNew(t, srv.Client(t), mutex.WithTTL(lease))
	lk, err := l.Lock(ctx, "job", mutex.WithAutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease) // a few renewals land
	if closed(lk.Done()) {
		t.Fatal("lost before the server stopped")
	}
	stopped := time.Now()
	srv.Kill()
	within(t, lk.Done(), hang, "Done after the server stopped")
	elapsed := time.Since(stopped)
	t.Logf("loss reported %v after the server stopped (lease %v, period %v)", elapsed, lease, lease/3)
	if bound := lease + lease/2; elapsed > bound {
		t.Fatalf("loss reported after %v, want <= lease + lease/2 = %v", elapsed, bound)
	}
	if cause := context.Cause(lk.Context(ctx)); !errors.Is(cause, mutex.ErrLockLost) {
		t.Fatalf("cause = %v, want ErrLockLost", cause)
	}
}

func TestAutoRenewOnHandedOverLock(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		const lease = renewLease
		l := newLocker(t, b, mutex.WithTTL(lease), mutex.WithRetryInterval(time.Hour))
		first, err := l.Lock(ctx, "job", mutex.WithTTL(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *mutex.Lock, 1)
		go func() {
			lk, err := l.Lock(ctx, "job", mutex.WithAutoRenew())
			if err != nil {
				t.Error(err)
			}
			got <- lk
		}()
		waitFor(t, "waiter", func() bool { return mutex.QueueLen(l, "job") == 1 })
		first.Unlock(ctx) // hands over
		lk := <-got
		time.Sleep(3 * lease)
		if ttl, err := lk.TTL(ctx); err != nil || ttl <= 0 {
			t.Fatalf("handed-over WithAutoRenew lock after 3 leases: TTL %v, %v", ttl, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
