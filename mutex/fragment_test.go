package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// readFragment returns its key's value and its own KEYS/ARGV counts, so the
// test sees that the fragment gets its own keys and arguments.
var readFragment = mutex.NewFragment(`
return {redis.call('GET', KEYS[1]) or '', #KEYS, #ARGV, ARGV[1] or ''}`)

var writeFragment = mutex.NewFragment(`redis.call('SET', KEYS[1], ARGV[1]) return 'written'`)

func TestTryLockWithReadsEitherWay(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		l := newLocker(t, b)
		state := b.Prefix + "{acct}:state"
		if err := c.Set(ctx, state, "v1", 0).Err(); err != nil {
			t.Fatal(err)
		}
		call := mutex.Call{Fragment: readFragment, Keys: []string{state}, Args: []any{"arg"}}
		want := []any{"v1", int64(1), int64(1), "arg"}

		lk, res, err := l.TryLockWith(ctx, "acct", call)
		if err != nil {
			t.Fatalf("TryLockWith = %v", err)
		}
		if !equal(res, want) {
			t.Fatalf("result when obtained = %#v, want %#v", res, want)
		}
		lk2, res, err := l.TryLockWith(ctx, "acct", call)
		if !errors.Is(err, mutex.ErrLocked) || lk2 != nil {
			t.Fatalf("TryLockWith on a held lock = %v, %v; want ErrLocked", lk2, err)
		}
		if !equal(res, want) {
			t.Fatalf("result when locked = %#v, want %#v", res, want)
		}

		res, err = lk.UnlockWith(ctx, mutex.Call{Fragment: writeFragment, Keys: []string{state}, Args: []any{"v2"}})
		if err != nil || res != "written" {
			t.Fatalf("UnlockWith = %v, %v", res, err)
		}
		if got := c.Get(ctx, state).Val(); got != "v2" {
			t.Fatalf("state = %q after UnlockWith, want v2", got)
		}
		if _, err := l.TryLock(ctx, "acct"); err != nil {
			t.Fatalf("UnlockWith did not release: %v", err)
		}
	})
}

func TestUnlockWithRefusesAfterLoss(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		const lease = 30 * time.Millisecond
		l := newLocker(t, b, mutex.WithTTL(lease))
		state := b.Prefix + "{acct}:state"
		stale, err := l.TryLock(ctx, "acct")
		if err != nil {
			t.Fatal(err)
		}
		expire(t, b, lease)
		fresh, err := l.TryLock(ctx, "acct", mutex.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fresh.UnlockWith(ctx, mutex.Call{Fragment: writeFragment, Keys: []string{state}, Args: []any{"new"}}); err != nil {
			t.Fatal(err)
		}
		res, err := stale.UnlockWith(ctx, mutex.Call{Fragment: writeFragment, Keys: []string{state}, Args: []any{"stale"}})
		if !errors.Is(err, mutex.ErrNotHeld) || res != nil {
			t.Fatalf("stale UnlockWith = %v, %v; want ErrNotHeld", res, err)
		}
		if got := c.Get(ctx, state).Val(); got != "new" {
			t.Fatalf("a stale holder's write landed: state = %q", got)
		}
	})
}

func TestFragmentErrorStillReleases(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b)
		lk, err := l.TryLock(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		bad := mutex.Call{Fragment: mutex.NewFragment(`return redis.error_reply('boom')`)}
		if _, err := lk.UnlockWith(ctx, bad); err == nil {
			t.Fatal("UnlockWith of a failing fragment returned no error")
		}
		if _, err := l.TryLock(ctx, "x"); err != nil {
			t.Fatalf("a failing fragment left the lock held: %v", err)
		}
	})
}

func equal(got any, want []any) bool {
	arr, ok := got.([]any)
	if !ok || len(arr) != len(want) {
		return false
	}
	for i := range arr {
		if arr[i] != want[i] {
			return false
		}
	}
	return true
}

func TestFailingReadFragmentTakesNoLock(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b)
		for _, src := range []string{`return redis.error_reply('boom')`, `return redis.call('NOSUCHCOMMAND')`} {
			lk, _, err := l.TryLockWith(ctx, "x", mutex.Call{Fragment: mutex.NewFragment(src)})
			if err == nil || lk != nil {
				t.Fatalf("TryLockWith(%s) = %v, %v; want an error", src, lk, err)
			}
		}
		if _, err := l.TryLock(ctx, "x"); err != nil {
			t.Fatalf("a failing read fragment left a lock: %v", err)
		}
	})
}

// argsFragment reports the KEYS and ARGV it was given, then scribbles over
// them: the lock's part of the script must still act on its own key and
// token (the wrappers hand the fragment the same tables, shifted in place).
var argsFragment = mutex.NewFragment(`
local out = {#KEYS, #ARGV}
for i = 1, #KEYS do out[#out + 1] = KEYS[i] end
for i = 1, #ARGV do out[#out + 1] = ARGV[i] end
for i = 1, 8 do KEYS[i] = 'scribbled' ARGV[i] = 'scribbled' end
return out`)

func TestFragmentSeesOnlyItsOwnKeysAndArgs(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		// With fencing the lock's scripts take one key more.
		t.Run("plain", func(t *testing.T) { fragmentSeesItsOwn(t, b, newLocker(t, b), false) })
		t.Run("fenced", func(t *testing.T) { fragmentSeesItsOwn(t, b, newLocker(t, b, mutex.WithFencing()), true) })
	})
}

func fragmentSeesItsOwn(t *testing.T, b *testutil.Backend, l *mutex.Locker, fenced bool) {
	{
		ctx := context.Background()
		var fence int64
		for _, tc := range []struct {
			keys []string
			args []any
		}{
			{nil, nil},
			{[]string{b.Prefix + "{k}:a"}, nil},
			{nil, []any{"x"}},
			{[]string{b.Prefix + "{k}:a", b.Prefix + "{k}:b"}, []any{"x", "y", "z", "w", "v", "u", "t"}},
		} {
			want := []any{int64(len(tc.keys)), int64(len(tc.args))}
			for _, k := range tc.keys {
				want = append(want, k)
			}
			want = append(want, tc.args...)
			call := mutex.Call{Fragment: argsFragment, Keys: tc.keys, Args: tc.args}

			lk, res, err := l.TryLockWith(ctx, "k", call)
			if err != nil || !equal(res, want) {
				t.Fatalf("TryLockWith(%d keys, %d args) = %#v, %v; want %#v", len(tc.keys), len(tc.args), res, err, want)
			}
			if fenced && lk.Fence() <= fence || !fenced && lk.Fence() != 0 {
				t.Fatalf("fence %d after %d (fencing %v)", lk.Fence(), fence, fenced)
			}
			fence = lk.Fence()
			if _, err := l.TryLock(ctx, "k"); !errors.Is(err, mutex.ErrLocked) {
				t.Fatalf("after a scribbling fragment, the lock is not held: %v", err)
			}
			if res, err := lk.Run(ctx, call); err != nil || !equal(res, want) {
				t.Fatalf("Run = %#v, %v; want %#v", res, err, want)
			}
			if res, err := lk.UnlockWith(ctx, call); err != nil || !equal(res, want) {
				t.Fatalf("UnlockWith = %#v, %v; want %#v", res, err, want)
			}
			lk, err = l.TryLock(ctx, "k")
			if err != nil {
				t.Fatalf("UnlockWith with a scribbling fragment did not release: %v", err)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}
