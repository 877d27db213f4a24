package mutex_test

// The tests of this file run the Locker on more than one server: on a Redis
// Cluster of three masters through a *redis.ClusterClient, and on a
// sentinel-monitored master and replica through redis.NewFailoverClient
// (testutil.ScaleOut). On the cluster, a script whose keys fall in different
// slots fails with CROSSSLOT, so every passing call here also shows that the
// keys it touched share one slot.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// braceNames are lock names with braces: unescaped, each would give its
// keys a hash tag of its own choosing, or none at all ("}{", "{}"), and the
// keys of one name would fall in different slots.
var braceNames = []string{"{", "}", "a{b}c", "}{", "{}", "order:{42}"}

// scaleLocker returns a Locker on a fresh client of d, under d's prefix.
func scaleLocker(t *testing.T, d *testutil.Deployment, opts ...mutex.Option) *mutex.Locker {
	return mustNew(t, d.Client(t), append([]mutex.Option{mutex.WithPrefix(d.Prefix)}, opts...)...)
}

func TestClusterTryLockAndLockContention(t *testing.T) {
	testutil.ScaleOut(t, func(t *testing.T, d *testutil.Deployment) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang, not a speed target
		defer cancel()
		a := scaleLocker(t, d, mutex.WithRetryInterval(5*time.Millisecond))
		b := scaleLocker(t, d, mutex.WithRetryInterval(5*time.Millisecond))
		for _, name := range braceNames {
			lk, err := a.TryLock(ctx, name)
			if err != nil {
				t.Fatalf("TryLock(%q) = %v", name, err)
			}
			if _, err := b.TryLock(ctx, name); !errors.Is(err, mutex.ErrLocked) {
				t.Fatalf("second TryLock(%q) = %v, want ErrLocked", name, err)
			}
			got := make(chan error, 1)
			go func() {
				lk2, err := b.Lock(ctx, name)
				if err == nil {
					err = lk2.Unlock(ctx)
				}
				got <- err
			}()
			select {
			case err := <-got:
				t.Fatalf("Lock(%q) returned %v while the lock was held", name, err)
			case <-time.After(30 * time.Millisecond):
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatalf("Unlock(%q) = %v", name, err)
			}
			if err := <-got; err != nil {
				t.Fatalf("waiting Lock(%q) after Unlock = %v", name, err)
			}
		}

		// Goroutines of two Lockers (two processes, in effect) take turns;
		// the count of holders inside the critical section is never above 1.
		const goroutines, each = 6, 15
		var inside, most, total atomic.Int64
		var wg sync.WaitGroup
		for i := range goroutines {
			l := a
			if i%2 == 1 {
				l = b
			}
			wg.Go(func() {
				for range each {
					lk, err := l.Lock(ctx, "a{b}c")
					if err != nil {
						t.Errorf("Lock: %v", err)
						return
					}
					n := inside.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(100 * time.Microsecond)
					inside.Add(-1)
					total.Add(1)
					if err := lk.Unlock(ctx); err != nil {
						t.Errorf("Unlock: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		if most.Load() != 1 || total.Load() != goroutines*each {
			t.Fatalf("%d acquisitions (want %d), at most %d holders at once (want 1)", total.Load(), goroutines*each, most.Load())
		}
	})
}

func TestClusterReentry(t *testing.T) {
	testutil.ScaleOut(t, func(t *testing.T, d *testutil.Deployment) {
		ctx := context.Background()
		a, b := scaleLocker(t, d), scaleLocker(t, d)
		for _, name := range braceNames {
			outer, err := a.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			owned := outer.Context(ctx)
			inner, err := a.TryLock(owned, name)
			if err != nil {
				t.Fatalf("re-entrant TryLock(%q) = %v", name, err)
			}
			inner2, err := a.Lock(owned, name)
			if err != nil {
				t.Fatalf("re-entrant Lock(%q) = %v", name, err)
			}
			if inner.Token() != outer.Token() || inner2.Token() != outer.Token() {
				t.Fatalf("re-entrant handles of %q have tokens %s, %s; want the owner's %s", name, inner.Token(), inner2.Token(), outer.Token())
			}
			for i, lk := range []*mutex.Lock{inner2, inner} {
				if err := lk.Unlock(ctx); err != nil {
					t.Fatalf("Unlock of inner handle %d of %q = %v", i, name, err)
				}
				if _, err := b.TryLock(ctx, name); !errors.Is(err, mutex.ErrLocked) {
					t.Fatalf("TryLock(%q) by another Locker with the outer handle open = %v, want ErrLocked", name, err)
				}
			}
			if err := outer.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			lk, err := b.TryLock(ctx, name)
			if err != nil {
				t.Fatalf("TryLock(%q) after the last handle was unlocked = %v", name, err)
			}
			lk.Unlock(ctx)
		}
	})
}

// An Unlock with a local waiter hands the lock over (locally, or in the release
// script): the lock is never free in between, so another Locker cannot take it.
func TestClusterHandOverToLocalWaiter(t *testing.T) {
	testutil.ScaleOut(t, func(t *testing.T, d *testutil.Deployment) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// A long retry interval: the waiter gets the lock by hand-over, not by
		// polling, well before its next attempt.
		l := scaleLocker(t, d, mutex.WithRetryInterval(time.Hour), mutex.WithoutNotifications())
		other := scaleLocker(t, d)
		for _, name := range []string{"}{", "job"} {
			holder, err := l.Lock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				lk  *mutex.Lock
				err error
			}
			got := make(chan result, 1)
			go func() {
				lk, err := l.Lock(ctx, name)
				got <- result{lk, err}
			}()
			waitFor(t, "the waiter to queue", func() bool { return mutex.QueueLen(l, name) == 1 })
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := other.TryLock(ctx, name); !errors.Is(err, mutex.ErrLocked) {
				t.Fatalf("TryLock(%q) by another Locker right after a hand-over = %v, want ErrLocked", name, err)
			}
			r := <-got
			if r.err != nil {
				t.Fatalf("waiter of %q: %v", name, r.err)
			}
			if err := r.lk.Unlock(ctx); err != nil {
				t.Fatalf("the waiter's Unlock = %v", err)
			}
			lk, err := other.TryLock(ctx, name)
			if err != nil {
				t.Fatalf("TryLock(%q) after the waiter unlocked = %v", name, err)
			}
			lk.Unlock(ctx)
		}
	})
}

// TryLockWith reads and UnlockWith writes data of the lock's slot in the
// lock's own scripts; a holder whose lease lapsed writes nothing.
func TestClusterFragmentComposition(t *testing.T) {
	testutil.ScaleOut(t, func(t *testing.T, d *testutil.Deployment) {
		ctx := context.Background()
		c := d.Client(t)
		const lease = 50 * time.Millisecond
		l := scaleLocker(t, d, mutex.WithTTL(lease))
		other := scaleLocker(t, d)
		for _, name := range braceNames {
			state := mustKey(t, l, name, "state")
			if err := c.Set(ctx, state, "v1", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			read := mutex.Call{Fragment: readFragment, Keys: []string{state}, Args: []any{"arg"}}
			want := []any{"v1", int64(1), int64(1), "arg"}
			lk, res, err := l.TryLockWith(ctx, name, read, mutex.WithTTL(time.Minute))
			if err != nil || !equal(res, want) {
				t.Fatalf("TryLockWith(%q) = %#v, %v; want %#v", name, res, err, want)
			}
			if _, res, err := other.TryLockWith(ctx, name, read); !errors.Is(err, mutex.ErrLocked) || !equal(res, want) {
				t.Fatalf("TryLockWith(%q) on a held lock = %#v, %v; want ErrLocked and %#v", name, res, err, want)
			}
			res, err = lk.UnlockWith(ctx, mutex.Call{Fragment: writeFragment, Keys: []string{state}, Args: []any{"v2"}})
			if err != nil || res != "written" {
				t.Fatalf("UnlockWith(%q) = %v, %v", name, res, err)
			}
			if got := c.Get(ctx, state).Val(); got != "v2" {
				t.Fatalf("state of %q = %q after UnlockWith, want v2", name, got)
			}

			stale, err := l.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(lease + 30*time.Millisecond) // the lease passes on the server
			fresh, err := other.TryLock(ctx, name)
			if err != nil {
				t.Fatalf("TryLock(%q) after the lease passed = %v", name, err)
			}
			if _, err := fresh.UnlockWith(ctx, mutex.Call{Fragment: writeFragment, Keys: []string{state}, Args: []any{"new"}}); err != nil {
				t.Fatal(err)
			}
			res, err = stale.UnlockWith(ctx, mutex.Call{Fragment: writeFragment, Keys: []string{state}, Args: []any{"stale"}})
			if !errors.Is(err, mutex.ErrNotHeld) || res != nil {
				t.Fatalf("stale UnlockWith(%q) = %v, %v; want ErrNotHeld", name, res, err)
			}
			if got := c.Get(ctx, state).Val(); got != "new" {
				t.Fatalf("state of %q = %q after a stale UnlockWith, want new", name, got)
			}
		}
	})
}

func TestClusterFencing(t *testing.T) {
	testutil.ScaleOut(t, func(t *testing.T, d *testutil.Deployment) {
		ctx := context.Background()
		// Only the lock meant to expire has the short lease: with it, every
		// Lock to Unlock would have to take less than 50 ms.
		const lease = 50 * time.Millisecond
		a := scaleLocker(t, d, mutex.WithFencing())
		b := scaleLocker(t, d, mutex.WithFencing())
		c := d.Client(t)
		for _, name := range braceNames {
			var last int64
			for i, how := range []string{"a", "b", "a after expiry", "b"} {
				l := a
				if i%2 == 1 {
					l = b
				}
				var opts []mutex.Option
				if i == 1 {
					opts = append(opts, mutex.WithTTL(lease))
				}
				lk, err := l.Lock(ctx, name, opts...)
				if err != nil {
					t.Fatal(err)
				}
				if lk.Fence() <= last {
					t.Fatalf("%q, %s: fence %d after %d", name, how, lk.Fence(), last)
				}
				last = lk.Fence()
				if i == 1 {
					time.Sleep(lease + 30*time.Millisecond) // lost by expiry, not unlocked
					continue
				}
				if err := lk.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if ttl := c.PTTL(ctx, mutex.InternalKey(a, name, "fence")).Val(); ttl <= 0 || ttl > mutex.DefaultFenceTTL {
				t.Fatalf("fence counter of %q has PTTL %v, want in (0, %v]", name, ttl, mutex.DefaultFenceTTL)
			}
		}
	})
}

// On the cluster, every key of one name lies in one slot, and the slots of
// brace names are their own: escaping keeps "}{" from hashing the whole key
// (which would split a name's keys over slots) and "b}x" from ending the hash
// tag early to borrow the slot of "b".
func TestClusterKeysOfANameShareASlot(t *testing.T) {
	c := testutil.Cluster(t)
	cl := c.Client(t)
	ctx := context.Background()
	l := mustNew(t, cl, mutex.WithPrefix(c.Prefix(t)))
	slots := map[int64]string{}
	for _, name := range append(braceNames, "b", "b}x", "plain") {
		var slot int64 = -1
		for _, kind := range []string{"lock", "fence", "released", "state", "x{y}"} {
			s, err := cl.ClusterKeySlot(ctx, mutex.InternalKey(l, name, kind)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot >= 0 && s != slot {
				t.Fatalf("keys of %q in slots %d and %d (kind %q)", name, slot, s, kind)
			}
			slot = s
		}
		if prev, dup := slots[slot]; dup {
			t.Fatalf("names %q and %q share slot %d", prev, name, slot)
		}
		slots[slot] = name
	}
}

// The premise of this file: on the cluster, a script whose keys lie in two
// slots fails, and fails the call. A fragment key outside the lock's slot
// must give CROSSSLOT and take no lock.
func TestClusterCrossSlotFails(t *testing.T) {
	c := testutil.Cluster(t)
	cl := c.Client(t)
	ctx := context.Background()
	l := mustNew(t, cl, mutex.WithPrefix(c.Prefix(t)))
	name, elsewhere := "acct", mustKey(t, l, "other", "state")
	s1, _ := cl.ClusterKeySlot(ctx, l.LockKey(name)).Result()
	s2, _ := cl.ClusterKeySlot(ctx, elsewhere).Result()
	if s1 == s2 {
		t.Fatalf("pick another key: both in slot %d", s1)
	}
	_, _, err := l.TryLockWith(ctx, name, mutex.Call{Fragment: readFragment, Keys: []string{elsewhere}})
	if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Fatalf("TryLockWith with a key of another slot = %v, want CROSSSLOT", err)
	}
	lk, err := l.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("TryLock after the failed call = %v: the failed call left a lock", err)
	}
	lk.Unlock(ctx)
}

// Overlapping calls on a cluster (or through a failover client) queue and
// go as one pipeline, which go-redis splits by node: names in different
// slots are each locked and unlocked, and none is left.
func TestClusterBatchedLocks(t *testing.T) {
	testutil.ScaleOut(t, func(t *testing.T, d *testutil.Deployment) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang, not a speed target
		defer cancel()
		c := d.Client(t)
		l := mustNew(t, c, mutex.WithPrefix(d.Prefix))
		shut, slots := takeEverySlot(t, c, l)
		defer shut()
		const queued = 24
		errs := make(chan error, queued)
		var wg sync.WaitGroup
		for i := range queued {
			wg.Go(func() {
				lk, err := l.Lock(ctx, "spread"+strconv.Itoa(i))
				if err == nil {
					err = lk.Unlock(ctx)
				}
				errs <- err
			})
		}
		waitQueued(t, l, queued)
		shut()
		wg.Wait()
		slots.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("Lock+Unlock: %v", err)
			}
		}
		for i := range queued {
			if n := c.Exists(ctx, l.LockKey("spread"+strconv.Itoa(i))).Val(); n != 0 {
				t.Fatalf("lock spread%d left after its Unlock", i)
			}
		}
	})
}
