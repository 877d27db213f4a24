package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// within fails t unless ch closes within d; d is a bound against hangs, not a
// measurement: callers pass hang, or more.
func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not closed after %v", what, d)
	}
}

// hang bounds a wait for something that must happen soon, however loaded
// the machine: long enough never to fail a correct run, short enough to end
// a hung one with a message.
const hang = 10 * time.Second

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestDoneAndContextAfterUnlock(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		bg := context.Background()
		lk, err := newLocker(t, b).TryLock(bg, "x")
		if err != nil {
			t.Fatal(err)
		}
		done, ctx := lk.Done(), lk.Context(bg)
		if closed(done) || ctx.Err() != nil {
			t.Fatal("Done or Context ended while the lock is held")
		}
		if err := lk.Unlock(bg); err != nil {
			t.Fatal(err)
		}
		within(t, done, hang, "Done after Unlock")
		within(t, ctx.Done(), hang, "Context after Unlock")
		if cause := context.Cause(ctx); !errors.Is(cause, mutex.ErrNotHeld) {
			t.Fatalf("cause after Unlock = %v, want ErrNotHeld", cause)
		}
		// Done asked for after the end is closed at once.
		if !closed(lk.Done()) {
			t.Fatal("Done of an unlocked handle is open")
		}
	})
}

func TestContextCancelledWhenLeasePasses(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		bg := context.Background()
		lk, err := newLocker(t, b, mutex.WithTTL(40*time.Millisecond)).TryLock(bg, "x")
		if err != nil {
			t.Fatal(err)
		}
		ctx := lk.Context(bg)
		within(t, ctx.Done(), hang, "Context after the lease")
		if cause := context.Cause(ctx); !errors.Is(cause, mutex.ErrLockLost) {
			t.Fatalf("cause = %v, want ErrLockLost", cause)
		}
		if !closed(lk.Done()) {
			t.Fatal("Done open after the lease passed")
		}
		if err := lk.Unlock(bg); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("Unlock of a lost lock = %v, want ErrNotHeld", err)
		}
	})
}

func TestExtendPushesTheDeadline(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		bg := context.Background()
		// The first lease must outlast TryLock and Extend, two round trips,
		// on a loaded machine: a second.
		const lease = time.Second
		lk, err := newLocker(t, b, mutex.WithTTL(lease)).TryLock(bg, "x")
		if err != nil {
			t.Fatal(err)
		}
		done := lk.Done()
		if err := lk.Extend(bg, time.Minute); err != nil {
			t.Fatal(err)
		}
		time.Sleep(lease + 200*time.Millisecond) // past the first lease
		if closed(done) {
			t.Fatal("Done closed at the old deadline after Extend")
		}
		if err := lk.Unlock(bg); err != nil {
			t.Fatal(err)
		}
		within(t, done, hang, "Done after Unlock")
	})
}

func TestLossReportedByUnlock(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		bg := context.Background()
		c := b.Client(t)
		l := newLocker(t, b)
		lk, err := l.TryLock(bg, "x")
		if err != nil {
			t.Fatal(err)
		}
		ctx := lk.Context(bg)
		// Someone deletes the key behind the holder's back.
		keys, _ := c.Keys(bg, b.Prefix+"*").Result()
		if len(keys) != 1 {
			t.Fatalf("keys under the prefix: %v", keys)
		}
		c.Del(bg, keys[0])
		if _, err := lk.TTL(bg); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("TTL after the key was deleted = %v, want ErrNotHeld", err)
		}
		within(t, ctx.Done(), hang, "Context after loss")
		if cause := context.Cause(ctx); !errors.Is(cause, mutex.ErrLockLost) {
			t.Fatalf("cause = %v, want ErrLockLost", cause)
		}
	})
}

func TestContextOfAnEndedLockIsCancelledAtOnce(t *testing.T) {
	b := testutil.Mini(t)
	bg := context.Background()
	lk, err := newLocker(t, b).TryLock(bg, "x")
	if err != nil {
		t.Fatal(err)
	}
	lk.Unlock(bg)
	ctx := lk.Context(bg)
	if ctx.Err() == nil || !errors.Is(context.Cause(ctx), mutex.ErrNotHeld) {
		t.Fatalf("Context of an unlocked handle: err %v, cause %v", ctx.Err(), context.Cause(ctx))
	}
}
