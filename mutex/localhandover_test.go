package mutex_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// TestLocalHandOverSendsNothing: an Unlock whose lock still has (nearly) the
// waiter's lease passes it on without a command; the waiter holds it for real
// (another Locker is refused), can re-enter, extend and unlock it, and the
// chain goes back through Redis after MaxChain hand-overs.
func TestLocalHandOverSendsNothing(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		hook := &counter{}
		c.AddHook(hook)
		l := mustNew(t, c, mutex.WithPrefix(b.Prefix), mutex.WithRetryInterval(time.Hour), mutex.WithoutNotifications())
		other := newLocker(t, b)

		// A local hand-over needs 90% of the waiter's lease (the Locker's
		// 10 s) left: with a lease of 10 s, the test would need the waiter
		// queued and the Unlock sent within a second of the Lock.
		holder, err := l.Lock(ctx, "job", mutex.WithTTL(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		// A re-entrant handle opened and closed first: its handle id was
		// used, and the waiter's re-entries must not reuse a live one.
		inner, err := l.Lock(holder.Context(ctx), "job")
		if err != nil {
			t.Fatal(err)
		}
		if err := inner.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		got := make(chan *mutex.Lock, 1)
		go func() {
			lk, err := l.Lock(ctx, "job")
			if err != nil {
				t.Error(err)
			}
			got <- lk
		}()
		waitFor(t, "the waiter to queue", func() bool { return mutex.QueueLen(l, "job") == 1 })
		before := hook.cmds.Load()
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		lk := <-got
		if n := hook.cmds.Load() - before; n != 0 {
			t.Fatalf("a local hand-over sent %d commands, want 0", n)
		}
		select {
		case <-holder.Done():
		default:
			t.Fatal("the old handle is still open after the hand-over")
		}
		if _, err := other.TryLock(ctx, "job"); !errors.Is(err, mutex.ErrLocked) {
			t.Fatalf("another Locker after the hand-over: %v, want ErrLocked", err)
		}
		if err := holder.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("the old handle's second Unlock = %v, want ErrNotHeld", err)
		}
		re, err := l.Lock(lk.Context(ctx), "job")
		if err != nil {
			t.Fatalf("re-entry into the handed lock: %v", err)
		}
		if err := re.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := lk.Extend(ctx, time.Minute); err != nil {
			t.Fatalf("Extend of the handed lock: %v", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock of the handed lock: %v", err)
		}
		if n := c.Exists(ctx, l.LockKey("job")).Val(); n != 0 {
			t.Fatal("the lock key outlived the last Unlock (a handle left open in Redis)")
		}
	})
}

// TestLocalHandOverNeedsTheLease: a lock whose remaining lease is under 90%
// of the waiter's lease goes through Redis, and the waiter gets a fresh token
// and its full lease.
func TestLocalHandOverNeedsTheLease(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b, mutex.WithRetryInterval(time.Hour), mutex.WithoutNotifications())
		holder, err := l.Lock(ctx, "job", mutex.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *mutex.Lock, 1)
		go func() {
			lk, err := l.Lock(ctx, "job", mutex.WithTTL(time.Hour))
			if err != nil {
				t.Error(err)
			}
			got <- lk
		}()
		waitFor(t, "the waiter to queue", func() bool { return mutex.QueueLen(l, "job") == 1 })
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		lk := <-got
		if lk.Token() == holder.Token() {
			t.Fatal("handed over locally with a minute left for a waiter that asked an hour")
		}
		if ttl, err := lk.TTL(ctx); err != nil || ttl < 59*time.Minute {
			t.Fatalf("the waiter's lease: %v, %v; want about an hour", ttl, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLocalHandOverChainIsBounded: 2*MaxChain+4 waiters of one Locker behind
// a holder; at most MaxChain hand-overs in a row keep the token (skip Redis), then one goes
// through Redis under a fresh token, where a waiter of another Locker that
// marked the lock would get its turn (TestChainYieldsToOtherLocker).
func TestLocalHandOverChainIsBounded(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := mustNew(t, b.Client(t), mutex.WithPrefix(b.Prefix))
		holder, err := l.Lock(ctx, "chain")
		if err != nil {
			t.Fatal(err)
		}
		const n = 2*mutex.MaxChain + 4
		tokens := make(chan string, n)
		var wg sync.WaitGroup
		defer wg.Wait()
		for range n {
			wg.Go(func() {
				lk, err := l.Lock(ctx, "chain")
				if err == nil {
					tokens <- lk.Token()
					err = lk.Unlock(ctx)
				}
				if err != nil {
					t.Error(err)
					tokens <- ""
				}
			})
		}
		waitFor(t, "the waiters to queue", func() bool { return mutex.QueueLen(l, "chain") == n })
		prev, run, distinct := holder.Token(), 1, 1
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		for range n {
			tok := <-tokens
			if tok != prev {
				prev, run, distinct = tok, 0, distinct+1
			}
			if run++; run > mutex.MaxChain+1 {
				t.Fatalf("one token held by %d holders in a row: the local chain is not bounded at %d hand-overs", run, mutex.MaxChain)
			}
		}
		// n+1 holders in chains of MaxChain+1: 3 tokens.
		if distinct < 3 {
			t.Fatalf("%d tokens for %d holders; want 3 or more", distinct, n+1)
		}
	})
}

// TestChainYieldsToOtherLocker: a waiter of another Locker (another process)
// that marked the lock gets it at the end of the holder's Locker's chain of
// hand-overs, not after all of that Locker's MaxChain+12 waiters.
func TestChainYieldsToOtherLocker(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := mustNew(t, b.Client(t), mutex.WithPrefix(b.Prefix))
		other := mustNew(t, b.Client(t), mutex.WithPrefix(b.Prefix))
		holder, err := l.Lock(ctx, "yield")
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var order []string
		got := func(who string, lk *mutex.Lock, err error) {
			if err == nil {
				mu.Lock()
				order = append(order, who)
				mu.Unlock()
				err = lk.Unlock(ctx)
			}
			if err != nil {
				t.Error(err)
			}
		}
		const n = mutex.MaxChain + 12
		var wg sync.WaitGroup
		wg.Go(func() {
			lk, err := other.Lock(ctx, "yield")
			got("other", lk, err)
		})
		waitFor(t, "the other Locker's waiter to queue", func() bool { return mutex.QueueLen(other, "yield") == 1 })
		for range n {
			wg.Go(func() {
				lk, err := l.Lock(ctx, "yield")
				got("local", lk, err)
			})
		}
		waitFor(t, "the waiters to queue", func() bool { return mutex.QueueLen(l, "yield") == n })
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		at := slices.Index(order, "other")
		if at < 0 || at >= n-2 {
			t.Fatalf("the other Locker's waiter got the lock after %d of the %d local waiters: the chain did not yield to it", at, n)
		}
	})
}
