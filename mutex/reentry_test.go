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
		outer, err := l.TryLock(bg, "x", mutex.WithTTL(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		inner, err := l.TryLock(outer.Context(bg), "x", mutex.WithTTL(time.Second))
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
		other, err := l.TryLock(bg, "x", mutex.WithTTL(time.Minute))
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

// Twelve handles of one owner (ids 1 to 11 share digits: "1" must not match
// "11"), closed in a scrambled order: each closes once, Extend and TTL
// answer per open handle, and only the last close frees the name, with a
// waiter's mark kept through every change of the handle list.
func TestReentryManyHandles(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		bg := context.Background()
		l := newLocker(t, b)
		root, err := l.TryLock(bg, "m", mutex.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		handles := []*mutex.Lock{root}
		for range 11 {
			lk, err := l.TryLock(root.Context(bg), "m")
			if err != nil {
				t.Fatalf("re-entry %d = %v", len(handles), err)
			}
			handles = append(handles, lk)
		}
		// A waiter of another Locker marks the lock.
		waiter := newLocker(t, b, mutex.WithRetryInterval(time.Hour))
		got := lockIn(t, waiter, "m")
		key := b.Prefix + "{m}:lock"
		waitFor(t, "waiter's mark", func() bool { return mutex.Marked(b.Client(t).Get(bg, key).Val()) })

		order := []int{1, 11, 0, 5, 10, 2, 9, 3, 8, 4, 7, 6}
		for i, h := range order {
			lk := handles[h]
			if err := lk.Extend(bg, time.Minute); err != nil {
				t.Fatalf("Extend of open handle %d = %v", h, err)
			}
			if err := lk.Unlock(bg); err != nil {
				t.Fatalf("Unlock of handle %d = %v", h, err)
			}
			if err := lk.Unlock(bg); !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("second Unlock of handle %d = %v, want ErrNotHeld", h, err)
			}
			if _, err := lk.TTL(bg); !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("TTL of closed handle %d = %v, want ErrNotHeld", h, err)
			}
			if i == len(order)-1 {
				break
			}
			if v := b.Client(t).Get(bg, key).Val(); !mutex.Marked(v) {
				t.Fatalf("after closing handle %d the lock lost its mark: %q", h, v)
			}
			if _, err := l.TryLock(bg, "m"); !errors.Is(err, mutex.ErrLocked) {
				t.Fatalf("name freed with %d handles open: %v", len(order)-1-i, err)
			}
		}
		select {
		case lk := <-got:
			lk.Unlock(bg)
		case <-time.After(5 * time.Second):
			t.Fatal("the marked waiter was not told of the last release")
		}
	})
}
