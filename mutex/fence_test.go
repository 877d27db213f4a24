package mutex_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

func TestFenceIncreases(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		// Only the lock that must expire has the short lease: with it, Lock
		// to re-entry to Unlock would have to take less than 30 ms.
		const lease = 30 * time.Millisecond
		a := newLocker(t, b, mutex.WithFencing())
		other := newLocker(t, b, mutex.WithFencing())
		var last int64
		check := func(lk *mutex.Lock, how string) {
			t.Helper()
			if lk.Fence() <= last {
				t.Fatalf("%s: fence %d after %d", how, lk.Fence(), last)
			}
			last = lk.Fence()
		}
		lk, err := a.Lock(ctx, "res")
		if err != nil {
			t.Fatal(err)
		}
		if now := time.Now().UnixMicro(); lk.Fence() < now-int64(time.Hour/time.Microsecond) {
			t.Fatalf("first fence %d is not seeded from the server time (~%d µs)", lk.Fence(), now)
		}
		check(lk, "first")
		inner, err := a.TryLock(lk.Context(ctx), "res")
		if err != nil || inner.Fence() != lk.Fence() {
			t.Fatalf("re-entry fence %d, %v; want the owner's %d", inner.Fence(), err, lk.Fence())
		}
		inner.Unlock(ctx)
		lk.Unlock(ctx)

		lk, _ = other.Lock(ctx, "res", mutex.WithTTL(lease))
		check(lk, "another Locker")
		expire(t, b, lease) // not unlocked: lost by expiry
		lk, err = a.Lock(ctx, "res")
		if err != nil {
			t.Fatal(err)
		}
		check(lk, "after expiry")
		lk.Unlock(ctx)

		if b.Mini != nil { // the counter itself expires
			b.Mini.FastForward(mutex.DefaultFenceTTL + time.Second)
			if b.Mini.Exists(b.Prefix + "{res}:fence") {
				t.Fatal("the fence counter did not expire")
			}
			lk, _ = a.Lock(ctx, "res")
			check(lk, "after the counter expired")
			lk.Unlock(ctx)
		} else if ttl := b.Client(t).PTTL(ctx, b.Prefix+"{res}:fence").Val(); ttl <= 0 || ttl > mutex.DefaultFenceTTL {
			t.Fatalf("fence counter TTL %v, want (0, %v]", ttl, mutex.DefaultFenceTTL)
		}
	})
}

func TestFenceAfterClockStepsBack(t *testing.T) {
	b := testutil.Mini(t)
	ctx := context.Background()
	l := newLocker(t, b, mutex.WithFencing())
	b.Mini.SetTime(time.Now())
	lk, _ := l.Lock(ctx, "res")
	first := lk.Fence()
	lk.Unlock(ctx)
	b.Mini.SetTime(time.Now().Add(-time.Hour)) // less than the counter's TTL
	lk, _ = l.Lock(ctx, "res")
	if lk.Fence() <= first {
		t.Fatalf("fence %d after %d with the clock set back an hour", lk.Fence(), first)
	}
}

func TestFenceIncreasesThroughHandOvers(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b, mutex.WithFencing())
		var mu sync.Mutex // the order of fences must follow the order of holding
		var fences []int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 20 {
					lk, err := l.Lock(ctx, "res")
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					fences = append(fences, lk.Fence())
					mu.Unlock()
					lk.Unlock(ctx)
				}
			})
		}
		wg.Wait()
		for i := 1; i < len(fences); i++ {
			if fences[i] <= fences[i-1] {
				t.Fatalf("fence %d at acquisition %d after %d", fences[i], i, fences[i-1])
			}
		}
	})
}

func TestNoFenceByDefault(t *testing.T) {
	b := testutil.Mini(t)
	lk, err := newLocker(t, b).Lock(context.Background(), "res")
	if err != nil || lk.Fence() != 0 {
		t.Fatalf("fence without WithFencing = %d, %v; want 0", lk.Fence(), err)
	}
	if b.Mini.Exists(b.Prefix + "{res}:fence") {
		t.Fatal("a fence counter was written without WithFencing")
	}
}
