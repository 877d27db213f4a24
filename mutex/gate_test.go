package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// openGate proceeds when its key holds "open", and returns the key's value.
var openGate = mutex.NewGate(`
local v = redis.call('GET', KEYS[1]) or ''
if v == 'open' then return {1, v} end
return {0, v}`)

func TestGateDeclinesWithoutLocking(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		l := newLocker(t, b)
		door := l.Key("g", "door")
		call := mutex.Call{Fragment: openGate, Keys: []string{door}}

		c.Set(ctx, door, "shut", 0)
		for _, try := range []func() (*mutex.Lock, any, error){
			func() (*mutex.Lock, any, error) { return l.TryLockWith(ctx, "g", call) },
			func() (*mutex.Lock, any, error) { return l.LockWith(ctx, "g", call) },
		} {
			lk, res, err := try()
			if !errors.Is(err, mutex.ErrDeclined) || lk != nil || res != "shut" {
				t.Fatalf("declining gate = %v, %v, %v; want ErrDeclined and the result", lk, res, err)
			}
		}
		if n := c.Exists(ctx, l.Key("g", "lock")).Val(); n != 0 {
			t.Fatal("a declining gate took the lock")
		}

		c.Set(ctx, door, "open", 0)
		lk, res, err := l.TryLockWith(ctx, "g", call)
		if err != nil || res != "open" {
			t.Fatalf("open gate = %v, %v", res, err)
		}
		// Held by another: the gate proceeds, the attempt fails.
		if _, res, err := l.TryLockWith(ctx, "g", call); !errors.Is(err, mutex.ErrLocked) || res != "open" {
			t.Fatalf("open gate on a held lock = %v, %v; want ErrLocked", res, err)
		}
		lk.Unlock(ctx)
	})
}

// A waiting LockWith stops waiting as soon as its gate declines.
func TestLockWithStopsWaitingWhenDeclined(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		l := newLocker(t, b, mutex.WithRetryInterval(2*time.Millisecond))
		door := l.Key("g", "door")
		c.Set(ctx, door, "open", 0)
		holder, err := newLocker(t, b).Lock(ctx, "g", mutex.Lease(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, _, err := l.LockWith(ctx, "g", mutex.Call{Fragment: openGate, Keys: []string{door}})
			errc <- err
		}()
		waitFor(t, "waiter", func() bool { return mutex.QueueLen(l, "g") == 1 })
		c.Set(ctx, door, "shut", 0)
		select {
		case err := <-errc:
			if !errors.Is(err, mutex.ErrDeclined) {
				t.Fatalf("LockWith = %v, want ErrDeclined", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("LockWith kept waiting after its gate declined")
		}
		if n := mutex.QueueLen(l, "g"); n != 0 {
			t.Fatalf("queue holds %d", n)
		}
		holder.Unlock(ctx)
	})
}

// A lock handed over to a LockWith waiter comes with the fragment's result,
// read under the lock.
func TestLockWithAfterHandOver(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		l := newLocker(t, b, mutex.WithRetryInterval(time.Hour))
		door := l.Key("g", "door")
		c.Set(ctx, door, "open", 0)
		first, err := l.Lock(ctx, "g", mutex.Lease(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		type out struct {
			lk  *mutex.Lock
			res any
			err error
		}
		got := make(chan out, 1)
		go func() {
			lk, res, err := l.LockWith(ctx, "g", mutex.Call{Fragment: readFragment, Keys: []string{door}, Args: []any{"a"}})
			got <- out{lk, res, err}
		}()
		waitFor(t, "waiter", func() bool { return mutex.QueueLen(l, "g") == 1 })
		c.Set(ctx, door, "changed while waiting", 0)
		first.Unlock(ctx) // hands over
		o := <-got
		if o.err != nil || !equal(o.res, []any{"changed while waiting", int64(1), int64(1), "a"}) {
			t.Fatalf("handed-over LockWith = %#v, %v", o.res, o.err)
		}
		if err := o.lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRunOnlyWhileHeld(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b)
		state := l.Key("r", "state")
		lk, err := l.Lock(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		if res, err := lk.Run(ctx, mutex.Call{Fragment: writeFragment, Keys: []string{state}, Args: []any{"v"}}); err != nil || res != "written" {
			t.Fatalf("Run while held = %v, %v", res, err)
		}
		if _, err := l.TryLock(ctx, "r"); !errors.Is(err, mutex.ErrLocked) {
			t.Fatal("Run released the lock")
		}
		res, err := lk.Run(ctx, mutex.Call{Fragment: openGate, Keys: []string{state}})
		if !errors.Is(err, mutex.ErrDeclined) || res != "v" {
			t.Fatalf("Run of a declining gate = %v, %v", res, err)
		}
		lk.Unlock(ctx)
		if _, err := lk.Run(ctx, mutex.Call{Fragment: writeFragment, Keys: []string{state}, Args: []any{"late"}}); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("Run after Unlock = %v, want ErrNotHeld", err)
		}
		if v := b.Client(t).Get(ctx, state).Val(); v != "v" {
			t.Fatalf("state = %q: a Run after Unlock wrote", v)
		}
	})
}
