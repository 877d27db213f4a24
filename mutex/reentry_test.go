package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

func TestReentryThroughContext(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		bg := context.Background()
		l := newLocker(t, b, mutex.WithRetryInterval(time.Hour))
		outer, err := l.Lock(bg, "acct")
		if err != nil {
			t.Fatal(err)
		}
		ctx := outer.Context(bg)

		// Same name through the owning context: no wait, a count of 2.
		inner, err := l.Lock(ctx, "acct")
		if err != nil {
			t.Fatalf("re-entrant Lock = %v", err)
		}
		if inner.Token() != outer.Token() {
			t.Error("a re-entry should share its owner's token")
		}
		inner2, err := l.TryLock(inner.Context(ctx), "acct")
		if err != nil {
			t.Fatalf("second re-entry = %v", err)
		}

		// Without the context it is contention like any other, even here.
		if _, err := l.TryLock(bg, "acct"); !errors.Is(err, mutex.ErrLocked) {
			t.Fatalf("TryLock without the owning ctx = %v, want ErrLocked", err)
		}
		// The context only owns its own name and Locker.
		if _, err := l.TryLock(ctx, "other"); err != nil {
			t.Fatalf("TryLock of another name through ctx = %v", err)
		}
		if _, err := newLocker(t, b).TryLock(ctx, "acct"); !errors.Is(err, mutex.ErrLocked) {
			t.Fatalf("another Locker re-entered through ctx: %v", err)
		}

		// Only the last Unlock frees the name; each handle unlocks once.
		for i, lk := range []*mutex.Lock{inner, outer} {
			if err := lk.Unlock(bg); err != nil {
				t.Fatalf("Unlock %d = %v", i, err)
			}
			if err := lk.Unlock(bg); !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("second Unlock of handle %d = %v, want ErrNotHeld", i, err)
			}
			if _, err := l.TryLock(bg, "acct"); !errors.Is(err, mutex.ErrLocked) {
				t.Fatalf("name freed with %d handles still open (TryLock = %v)", 2-i, err)
			}
		}
		if err := inner2.Unlock(bg); err != nil {
			t.Fatalf("last Unlock = %v", err)
		}
		lk, err := l.TryLock(bg, "acct")
		if err != nil {
			t.Fatalf("after the last Unlock, TryLock = %v", err)
		}
		lk.Unlock(bg)

		// A context whose lock ended owns nothing: re-entry reports it.
		if _, err := l.TryLock(ctx, "acct"); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("re-entry after the owner unlocked = %v, want ErrNotHeld", err)
		}
	})
}

func TestReentryKeepsTheLongerLease(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		bg := context.Background()
		l := newLocker(t, b)
		outer, err := l.TryLock(bg, "x", mutex.Lease(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		inner, err := l.TryLock(outer.Context(bg), "x", mutex.Lease(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if ttl, err := inner.TTL(bg); err != nil || ttl < 59*time.Minute {
			t.Fatalf("re-entry with a shorter lease left TTL %v, %v; want the owner's hour", ttl, err)
		}
	})
}

func TestReentryAfterExpiryFails(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		bg := context.Background()
		const lease = 30 * time.Millisecond
		l := newLocker(t, b, mutex.WithTTL(lease))
		outer, err := l.TryLock(bg, "x")
		if err != nil {
			t.Fatal(err)
		}
		ctx := outer.Context(bg)
		expire(t, b, lease)
		other, err := l.TryLock(bg, "x", mutex.Lease(time.Minute))
		if err != nil {
			t.Fatalf("TryLock after expiry = %v", err)
		}
		if _, err := l.TryLock(ctx, "x"); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("re-entry of a lost lock = %v, want ErrNotHeld", err)
		}
		if ttl, err := other.TTL(bg); err != nil || ttl < 50*time.Second {
			t.Fatalf("the failed re-entry touched the new holder's lock: TTL %v, %v", ttl, err)
		}
	})
}
