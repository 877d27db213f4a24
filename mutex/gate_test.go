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

// openGate proceeds when its key holds "open", and returns the key's value
// and its own ARGV count.
var openGate = mutex.NewGate(`
local v = redis.call('GET', KEYS[1]) or ''
if v == 'open' then return {1, v, #ARGV} end
return {0, v, #ARGV}`)

// gateResult is openGate's result for value v and no arguments.
func gateResult(v string) []any { return []any{v, int64(0)} }

func TestGateDeclinesWithoutLocking(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		l := newLocker(t, b)
		door := mustKey(t, l, "g", "door")
		call := mutex.Call{Fragment: openGate, Keys: []string{door}}

		c.Set(ctx, door, "shut", 0)
		for _, try := range []func() (*mutex.Lock, any, error){
			func() (*mutex.Lock, any, error) { return l.TryLockWith(ctx, "g", call) },
			func() (*mutex.Lock, any, error) { return l.LockWith(ctx, "g", call) },
		} {
			lk, res, err := try()
			if !errors.Is(err, mutex.ErrDeclined) || lk != nil || !equal(res, gateResult("shut")) {
				t.Fatalf("declining gate = %v, %v, %v; want ErrDeclined and the result", lk, res, err)
			}
		}
		if n := c.Exists(ctx, l.LockKey("g")).Val(); n != 0 {
			t.Fatal("a declining gate took the lock")
		}

		c.Set(ctx, door, "open", 0)
		lk, res, err := l.TryLockWith(ctx, "g", call)
		if err != nil || !equal(res, gateResult("open")) {
			t.Fatalf("open gate = %v, %v", res, err)
		}
		// Held by another: the gate proceeds, the attempt fails.
		if _, res, err := l.TryLockWith(ctx, "g", call); !errors.Is(err, mutex.ErrLocked) || !equal(res, gateResult("open")) {
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
		door := mustKey(t, l, "g", "door")
		c.Set(ctx, door, "open", 0)
		holder, err := newLocker(t, b).Lock(ctx, "g", mutex.WithTTL(time.Hour))
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
		door := mustKey(t, l, "g", "door")
		c.Set(ctx, door, "open", 0)
		first, err := l.Lock(ctx, "g", mutex.WithTTL(time.Hour))
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
		state := mustKey(t, l, "r", "state")
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
		if !errors.Is(err, mutex.ErrDeclined) || !equal(res, gateResult("v")) {
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

// Waiters that leave on a declining gate or an ended ctx while a holder is
// handing them the lock must pass it on, never strand it until its lease
// ends: after the storm, with a one-minute lease, no lock may be left (once
// the late replies of abandoned attempts are in).
func TestNoLockStrandedWhenLeaving(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		l := newLocker(t, b, mutex.WithTTL(time.Minute), mutex.WithRetryInterval(time.Millisecond))
		door := mustKey(t, l, "g", "door")
		c.Set(ctx, door, "open", 0)
		stop := make(chan struct{})
		flipped := make(chan struct{})
		go func() { // the gate flips between open and shut
			defer close(flipped)
			for i := 0; ; i++ {
				select {
				case <-stop:
					c.Set(ctx, door, "open", 0)
					return
				case <-time.After(200 * time.Microsecond):
				}
				c.Set(ctx, door, []string{"open", "shut"}[i%2], 0)
			}
		}()
		var wg sync.WaitGroup
		var got, declined, timedOut atomic.Int64
		for g := range 16 {
			wg.Go(func() {
				for i := range 60 {
					// Mostly 1 to 5 ms, to leave while being handed the lock;
					// every sixth call waits until its gate decides, so that
					// both outcomes show however slow the machine (with 5 ms
					// at most, a loaded one can time every call out).
					wait := time.Duration(1+(g+i)%5) * time.Millisecond
					if (g+i)%6 == 0 {
						wait = hang
					}
					cctx, cancel := context.WithTimeout(ctx, wait)
					lk, _, err := l.LockWith(cctx, "g", mutex.Call{Fragment: openGate, Keys: []string{door}})
					cancel()
					switch {
					case err == nil:
						got.Add(1)
						if err := lk.Unlock(ctx); err != nil {
							t.Errorf("Unlock: %v", err)
						}
					case errors.Is(err, mutex.ErrDeclined):
						declined.Add(1)
					case errors.Is(err, mutex.ErrNotObtained):
						timedOut.Add(1)
					default:
						t.Errorf("LockWith: %v", err)
					}
				}
			})
		}
		wg.Wait()
		close(stop)
		<-flipped
		t.Logf("acquired %d, declined %d, timed out %d", got.Load(), declined.Load(), timedOut.Load())
		if got.Load() == 0 || declined.Load() == 0 {
			t.Fatal("the storm did not exercise both outcomes")
		}
		// An attempt that its ctx cut short may still run in Redis (the
		// client ignores deadlines, so it finishes in a goroutine of its
		// own) and take the lock after its caller left; it is released as
		// soon as its reply arrives. A stranded lock would stay a minute.
		waitFor(t, "no lock left after the storm", func() bool {
			if c.Exists(ctx, l.LockKey("g")).Val() == 0 {
				return true
			}
			return false
		})
		if _, err := l.TryLock(ctx, "g"); err != nil {
			t.Fatalf("after the storm TryLock = %v", err)
		}
	})
}
