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

func TestTryLockExcludes(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b)
		lk, err := l.TryLock(ctx, "order:42")
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		if got := len(lk.Token()); got != 32 {
			t.Errorf("token %q has %d hex digits, want 32 (128 bits)", lk.Token(), got)
		}
		if lk.Name() != "order:42" {
			t.Errorf("Name = %q", lk.Name())
		}
		if _, err := l.TryLock(ctx, "order:42"); !errors.Is(err, mutex.ErrLocked) {
			t.Fatalf("second TryLock = %v, want ErrLocked", err)
		}
		// Another Locker on another connection sees the same lock.
		if _, err := newLocker(t, b).TryLock(ctx, "order:42"); !errors.Is(err, mutex.ErrLocked) {
			t.Fatalf("TryLock from another Locker = %v, want ErrLocked", err)
		}
		if _, err := l.TryLock(ctx, "order:43"); err != nil {
			t.Fatalf("TryLock of another name = %v", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		lk2, err := l.TryLock(ctx, "order:42")
		if err != nil {
			t.Fatalf("TryLock after Unlock = %v", err)
		}
		if lk2.Token() == lk.Token() {
			t.Error("a new acquisition reused the old token")
		}
	})
}

func TestHundredGoroutinesOneWinner(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		lockers := []*mutex.Locker{newLocker(t, b), newLocker(t, b), newLocker(t, b), newLocker(t, b)}
		var won, lost atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 100 {
			wg.Go(func() {
				<-start
				_, err := lockers[i%len(lockers)].TryLock(ctx, "race")
				switch {
				case err == nil:
					won.Add(1)
				case errors.Is(err, mutex.ErrLocked):
					lost.Add(1)
				default:
					t.Errorf("TryLock: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		if won.Load() != 1 || lost.Load() != 99 {
			t.Fatalf("winners %d, ErrLocked %d; want 1 and 99", won.Load(), lost.Load())
		}
	})
}

// expire lets the lease of a lock of lease d pass on b.
func expire(t *testing.T, b *testutil.Backend, d time.Duration) {
	if b.Mini != nil {
		b.Mini.FastForward(d + time.Millisecond)
		return
	}
	time.Sleep(d + 20*time.Millisecond)
}

func TestExpiryFreesAndStaleReleaseIsHarmless(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		const lease = 50 * time.Millisecond
		l := newLocker(t, b, mutex.WithTTL(lease))
		old, err := l.TryLock(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		expire(t, b, lease)
		next, err := l.TryLock(ctx, "job", mutex.WithTTL(time.Minute))
		if err != nil {
			t.Fatalf("TryLock after expiry = %v, want success", err)
		}
		if err := old.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("Unlock of the expired lock = %v, want ErrNotHeld", err)
		}
		if err := old.Extend(ctx, time.Minute); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("Extend of the expired lock = %v, want ErrNotHeld", err)
		}
		if _, err := old.TTL(ctx); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("TTL of the expired lock = %v, want ErrNotHeld", err)
		}
		// The stale calls must not have touched the next holder's lock.
		if _, err := l.TryLock(ctx, "job"); !errors.Is(err, mutex.ErrLocked) {
			t.Fatalf("after the stale Unlock, TryLock = %v, want ErrLocked", err)
		}
		ttl, err := next.TTL(ctx)
		if err != nil || ttl < 50*time.Second {
			t.Fatalf("next holder's TTL = %v, %v; want about a minute", ttl, err)
		}
		if err := next.Unlock(ctx); err != nil {
			t.Fatalf("next holder's Unlock = %v", err)
		}
	})
}

func TestUnlockTwiceAndNil(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b)
		lk, err := l.TryLock(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// Someone else takes it; a second Unlock must not release theirs.
		other, err := l.TryLock(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("second Unlock = %v, want ErrNotHeld", err)
		}
		if _, err := l.TryLock(ctx, "x"); !errors.Is(err, mutex.ErrLocked) {
			t.Fatalf("second Unlock released another holder's lock (TryLock = %v)", err)
		}
		if err := other.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		var nilLock *mutex.Lock
		if err := nilLock.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("nil Unlock = %v, want ErrNotHeld", err)
		}
	})
}

func TestUnlockWithCancelledContext(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		l := newLocker(t, b)
		lk, err := l.TryLock(context.Background(), "x")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock with a cancelled ctx = %v, want the lock released", err)
		}
		if _, err := l.TryLock(context.Background(), "x"); err != nil {
			t.Fatalf("lock still held after Unlock with a cancelled ctx: %v", err)
		}
	})
}

// lateTimer is a context whose deadline has passed but whose timer has not
// fired yet (on a loaded machine it fires late): Err is still nil.
type lateTimer struct{ context.Context }

func (lateTimer) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }
func (lateTimer) Done() <-chan struct{}       { return make(chan struct{}) }

// Unlock with a context whose deadline has passed releases the lock, as it
// does with one that has ended, even before the context's timer says so:
// it used to fail at once with a deadline in the past, and the lock lasted
// its lease (a funnel leader whose lock's reply came just after its
// deadline left its key locked for 3 s).
func TestUnlockPastDeadlineBeforeItsTimer(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		l := newLocker(t, b)
		lk, err := l.TryLock(context.Background(), "x")
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(lateTimer{context.Background()}); err != nil {
			t.Fatalf("Unlock past its deadline = %v, want the lock released", err)
		}
		if _, err := l.TryLock(context.Background(), "x"); err != nil {
			t.Fatalf("lock still held after Unlock past its deadline: %v", err)
		}
	})
}

func TestExtendAndTTL(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b, mutex.WithTTL(time.Second))
		lk, err := l.TryLock(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if ttl, err := lk.TTL(ctx); err != nil || ttl <= 0 || ttl > time.Second {
			t.Fatalf("TTL = %v, %v; want within (0, 1s]", ttl, err)
		}
		if err := lk.Extend(ctx, time.Hour); err != nil {
			t.Fatal(err)
		}
		if ttl, err := lk.TTL(ctx); err != nil || ttl < 59*time.Minute {
			t.Fatalf("TTL after Extend(1h) = %v, %v", ttl, err)
		}
		if err := lk.Extend(ctx, 0); !errors.Is(err, mutex.ErrInvalid) {
			t.Fatalf("Extend(0) = %v, want ErrInvalid", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := lk.Extend(ctx, time.Hour); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("Extend after Unlock = %v, want ErrNotHeld", err)
		}
	})
}

func TestLockWaitsForRelease(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b, mutex.WithRetryInterval(5*time.Millisecond))
		first, err := l.Lock(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			lk, err := l.Lock(ctx, "x")
			if err == nil {
				err = lk.Unlock(ctx)
			}
			got <- err
		}()
		select {
		case err := <-got:
			t.Fatalf("second Lock returned %v while the first holder held the lock", err)
		case <-time.After(50 * time.Millisecond):
		}
		if err := first.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("waiting Lock = %v", err)
		}
	})
}

func TestLockWaitsPastTheLease(t *testing.T) {
	// A waiter is not capped at the holder's TTL: it waits as long as ctx allows.
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b, mutex.WithTTL(20*time.Millisecond), mutex.WithRetryInterval(2*time.Millisecond))
		holder, err := l.TryLock(ctx, "x", mutex.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			lk, err := l.Lock(ctx, "x")
			if err == nil {
				// The waiter's own lease is the Locker's 20 ms: on a loaded
				// machine it may lapse before this Unlock, which is not what
				// the test is about.
				if err = lk.Unlock(ctx); errors.Is(err, mutex.ErrNotHeld) {
					err = nil
				}
			}
			done <- err
		}()
		time.Sleep(100 * time.Millisecond) // five of the Locker's TTLs
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Lock gave up: %v", err)
		}
	})
}

func TestLockContextEnds(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		l := newLocker(t, b, mutex.WithRetryInterval(time.Hour)) // only ctx can end the wait
		if _, err := l.TryLock(context.Background(), "x"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		_, err := l.Lock(ctx, "x")
		if !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock past the deadline = %v, want ErrNotObtained and DeadlineExceeded", err)
		}

		ctx, cancel = context.WithCancel(context.Background())
		time.AfterFunc(10*time.Millisecond, cancel)
		_, err = l.Lock(ctx, "x")
		if !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Lock = %v, want ErrNotObtained and Canceled", err)
		}

		_, err = l.Lock(ctx, "free") // already cancelled: not even one attempt succeeds
		if !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Lock with a cancelled ctx = %v, want ErrNotObtained and Canceled", err)
		}
	})
}
