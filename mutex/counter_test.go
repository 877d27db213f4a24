package mutex_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// setFragment is the commit of a read-modify-write: it lands only while the
// committing handle still holds the lock (through Lock.UnlockWith).
var setFragment = mutex.NewFragment("redis.call('SET', KEYS[1], ARGV[1]) return 1")

// counterKey is the key of the counter guarded by the lock on name. It shares
// the lock key's {hash tag}, as a Fragment's keys must on a cluster.
func counterKey(b *testutil.Backend, name string) string {
	return keyspace.Key(b.Prefix, name, "n") // what Locker.Key returns
}

// getCounter reads a counter; a missing key is 0.
func getCounter(t testing.TB, ctx context.Context, c *redis.Client, key string) int64 {
	n, err := c.Get(ctx, key).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Errorf("GET %s: %v", key, err)
	}
	return n
}

// busyWait waits d without sleeping: time.Sleep(50µs) can last a millisecond
// (timer granularity), and 10,000 critical sections in a row would then spend
// ten seconds asleep.
func busyWait(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
		runtime.Gosched()
	}
}

// TestCounterExactUnderLock increments one counter from many goroutines and
// connections with a non-atomic GET, pause, SET under the lock: if the lock
// ever let two holders in at once, increments would be lost.
func TestCounterExactUnderLock(t *testing.T) {
	b := testutil.RealBackend(t)
	// A bound against a hang, not a speed target: 10,000 lock hand-offs
	// take seconds, and many times that on a loaded 2-core machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const (
		name       = "counter"
		increments = 10_000
		lockers    = 4
		perLocker  = 8
		pause      = 50 * time.Microsecond // widens the GET..SET window
	)
	key := counterKey(b, name)
	var remaining atomic.Int64
	remaining.Store(increments)
	var inside atomic.Int32 // holders inside the critical section, seen in-process
	var wg sync.WaitGroup
	for range lockers {
		// With 1 ms the test took 20 s under -race on 2 CPUs, mostly polling;
		// with many waiters 10 ms still hands the lock over within a fraction
		// of a millisecond.
		l := newLocker(t, b, mutex.WithRetryInterval(10*time.Millisecond))
		c := b.Client(t) // the data goes over its own connection pool
		for range perLocker {
			wg.Go(func() {
				for remaining.Add(-1) >= 0 {
					lk, err := l.Lock(ctx, name)
					if err != nil {
						t.Errorf("Lock: %v", err)
						return
					}
					if n := inside.Add(1); n != 1 {
						t.Errorf("%d holders inside the critical section at once", n)
					}
					v := getCounter(t, ctx, c, key)
					busyWait(pause)
					if err := c.Set(ctx, key, v+1, 0).Err(); err != nil {
						t.Errorf("SET: %v", err)
					}
					inside.Add(-1)
					if err := lk.Unlock(ctx); err != nil {
						t.Errorf("Unlock: %v (the lease lapsed inside the critical section?)", err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if got := getCounter(t, ctx, b.Client(t), key); got != increments {
		t.Fatalf("counter = %d after %d increments under the lock; %d lost", got, increments, increments-got)
	}
}

// TestSeedScenarioLostUpdate replays, step by step, the lease that ends inside
// the critical section: holder A reads, its lease lapses, B reads the same
// value, writes and unlocks, then A writes. With a plain SET, A's stale write
// lands and one increment is lost; committing through UnlockWith, A's write is
// refused with ErrNotHeld, A redoes its increment and nothing is lost.
func TestSeedScenarioLostUpdate(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		const lease = 50 * time.Millisecond
		c := b.Client(t)
		la := newLocker(t, b, mutex.WithTTL(lease))
		lb := newLocker(t, b)

		// race runs the scenario on name up to A's commit and returns A's
		// handle and the value A read. The counter key then carries a TTL as a
		// marker: a plain SET clears it, so it shows whether A's commit wrote.
		race := func(t *testing.T, name string) (*mutex.Lock, int64) {
			t.Helper()
			key := counterKey(b, name)
			a, err := la.TryLock(ctx, name)
			if err != nil {
				t.Fatalf("A: TryLock = %v", err)
			}
			va := getCounter(t, ctx, c, key)
			if va != 0 {
				t.Fatalf("A read %d from a fresh counter, want 0", va)
			}
			expire(t, b, lease)
			bl, err := lb.TryLock(ctx, name)
			if err != nil {
				t.Fatalf("B: TryLock after A's lease lapsed = %v, want success", err)
			}
			vb := getCounter(t, ctx, c, key)
			if vb != va {
				t.Fatalf("B read %d, want %d (A has not written yet)", vb, va)
			}
			if _, err := bl.UnlockWith(ctx, mutex.Call{Fragment: setFragment, Keys: []string{key}, Args: []any{vb + 1}}); err != nil {
				t.Fatalf("B: commit = %v", err)
			}
			if err := c.PExpire(ctx, key, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			return a, va
		}
		marked := func(t *testing.T, key string) bool {
			t.Helper()
			d, err := c.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			return d > 0
		}

		t.Run("plain SET", func(t *testing.T) {
			const name = "plain"
			key := counterKey(b, name)
			a, va := race(t, name)
			if err := c.Set(ctx, key, va+1, 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := a.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
				t.Errorf("A: Unlock after its lease lapsed = %v, want ErrNotHeld", err)
			}
			if marked(t, key) {
				t.Error("A's SET did not reach the counter: the scenario did not run as written")
			}
			if got := getCounter(t, ctx, c, key); got != 1 {
				t.Fatalf("counter = %d after two plain increments with a lapsed lease, want 1 (one lost)", got)
			}
		})

		t.Run("commit while held", func(t *testing.T) {
			const name = "held"
			key := counterKey(b, name)
			a, va := race(t, name)
			res, err := a.UnlockWith(ctx, mutex.Call{Fragment: setFragment, Keys: []string{key}, Args: []any{va + 1}})
			if !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("A: commit after its lease lapsed = %v, %v; want ErrNotHeld", res, err)
			}
			if res != nil {
				t.Errorf("A: refused commit returned %v, want nil", res)
			}
			if !marked(t, key) {
				t.Error("A's refused commit wrote the counter anyway")
			}
			if got := getCounter(t, ctx, c, key); got != 1 {
				t.Fatalf("counter = %d after A's refused commit, want B's 1", got)
			}

			// A knows its increment did not land: it does it again, from the read.
			for try := 1; ; try++ {
				if try > 5 {
					t.Fatal("A: no commit in 5 tries")
				}
				a, err := la.Lock(ctx, name, mutex.WithTTL(10*time.Second))
				if err != nil {
					t.Fatalf("A: Lock = %v", err)
				}
				v := getCounter(t, ctx, c, key)
				res, err := a.UnlockWith(ctx, mutex.Call{Fragment: setFragment, Keys: []string{key}, Args: []any{v + 1}})
				if errors.Is(err, mutex.ErrNotHeld) {
					continue
				}
				if err != nil {
					t.Fatalf("A: commit = %v", err)
				}
				if res != int64(1) {
					t.Errorf("A: commit returned %v (%T), want the fragment's 1", res, res)
				}
				break
			}
			if got := getCounter(t, ctx, c, key); got != 2 {
				t.Fatalf("counter = %d after two increments committed while held, want 2", got)
			}
			if _, err := lb.TryLock(ctx, name); err != nil {
				t.Fatalf("TryLock after A's commit = %v: UnlockWith did not release", err)
			}
		})
	})
}

// TestSeedScenarioConcurrent runs many holders whose critical section often
// outlasts the lease. Plain SETs lose updates; commits through UnlockWith
// either land while held or are refused, so every accepted commit counts.
func TestSeedScenarioConcurrent(t *testing.T) {
	b := testutil.RealBackend(t)
	const (
		lease      = 5 * time.Millisecond
		goroutines = 8
		attempts   = 60 // per goroutine
		maxPause   = 10 * time.Millisecond
	)
	// run starts goroutines on two Lockers, each making attempts calls of step
	// with the lock on name held, and returns the final counter.
	run := func(t *testing.T, name string, step func(lk *mutex.Lock, c *redis.Client, key string)) int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang, not a speed target
		defer cancel()
		key := counterKey(b, name)
		ls := []*mutex.Locker{
			newLocker(t, b, mutex.WithTTL(lease), mutex.WithRetryInterval(time.Millisecond)),
			newLocker(t, b, mutex.WithTTL(lease), mutex.WithRetryInterval(time.Millisecond)),
		}
		cs := []*redis.Client{b.Client(t), b.Client(t)}
		var wg sync.WaitGroup
		for g := range goroutines {
			l, c := ls[g%2], cs[g%2]
			wg.Go(func() {
				for range attempts {
					lk, err := l.Lock(ctx, name)
					if err != nil {
						t.Errorf("Lock: %v", err)
						return
					}
					step(lk, c, key)
				}
			})
		}
		wg.Wait()
		return getCounter(t, ctx, cs[0], key)
	}
	pause := func() { time.Sleep(rand.N(maxPause + time.Millisecond)) }

	t.Run("plain", func(t *testing.T) {
		var sets atomic.Int64
		got := run(t, "plain", func(lk *mutex.Lock, c *redis.Client, key string) {
			ctx := context.Background()
			v := getCounter(t, ctx, c, key)
			pause()
			if err := c.Set(ctx, key, v+1, 0).Err(); err != nil {
				t.Errorf("SET: %v", err)
				return
			}
			sets.Add(1)
			if err := lk.Unlock(ctx); err != nil && !errors.Is(err, mutex.ErrNotHeld) {
				t.Errorf("Unlock: %v", err)
			}
		})
		t.Logf("%d SETs, counter %d", sets.Load(), got)
		if got >= sets.Load() {
			t.Fatalf("counter = %d after %d plain SETs with leases lapsing: no update lost, the scenario did not reproduce", got, sets.Load())
		}
	})

	t.Run("commit while held", func(t *testing.T) {
		var ok, refused atomic.Int64
		got := run(t, "held", func(lk *mutex.Lock, c *redis.Client, key string) {
			ctx := context.Background()
			v := getCounter(t, ctx, c, key)
			pause()
			_, err := lk.UnlockWith(ctx, mutex.Call{Fragment: setFragment, Keys: []string{key}, Args: []any{v + 1}})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, mutex.ErrNotHeld):
				refused.Add(1)
			default:
				t.Errorf("UnlockWith: %v", err)
			}
		})
		t.Logf("%d commits, %d refused, counter %d", ok.Load(), refused.Load(), got)
		if got != ok.Load() {
			t.Fatalf("counter = %d after %d accepted commits, want equal (a commit was lost, or a refused one wrote)", got, ok.Load())
		}
		if refused.Load() == 0 {
			t.Fatal("no commit was refused: the lapsed-lease path was not exercised")
		}
		if ok.Load() == 0 {
			t.Fatal("no commit was accepted")
		}
	})
}
