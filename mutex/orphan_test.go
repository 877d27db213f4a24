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
	"github.com/redis/go-redis/v9"
)

// Recover at once: an acquire attempt whose caller gave up while the server
// was stopped runs when the server continues, and takes the lock under a
// token nobody holds. The next attempt of the same Locker adopts it (under
// that token) instead of waiting out its lease, and only one attempt does:
// one owner per name still holds.
func TestAbandonedAttemptIsAdopted(t *testing.T) {
	const lease = orphanLease
	srv, c, admin, l := orphanRig(t)
	ctx := context.Background()
	lk, err := l.Lock(ctx, "name") // a pooled connection for the attempt below
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	idleConns(t, c, 8)
	thaw := testutil.Freeze(t, srv.Pid())
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = l.Lock(short, "name")
	cancel()
	if !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("Lock on a stopped server = %v, want ErrNotObtained", err)
	}
	thawPastDeadline(thaw)
	// The abandoned attempt runs now: the lock is held, by nobody.
	if !heldWithin(admin, l.LockKey("name"), 2*time.Second) {
		t.Fatalf("the abandoned attempt took no lock: the test proves nothing")
	}

	// Concurrent attempts: exactly one adopts the lock.
	var won atomic.Int32
	var winner *mutex.Lock
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			lk, err := l.TryLock(ctx, "name")
			switch {
			case err == nil:
				won.Add(1)
				winner = lk
			case !errors.Is(err, mutex.ErrLocked):
				t.Errorf("TryLock: %v", err)
			}
		})
	}
	wg.Wait()
	if won.Load() != 1 {
		t.Fatalf("%d TryLock calls got the orphaned lock; want exactly 1 (it adopts it)", won.Load())
	}
	if ttl := admin.PTTL(ctx, l.LockKey("name")).Val(); ttl > lease {
		t.Errorf("adopted lock has %v left, more than its lease", ttl)
	}
	if err := winner.Unlock(ctx); err != nil {
		t.Fatalf("Unlock of the adopted lock: %v", err)
	}
	if n := admin.Exists(ctx, l.LockKey("name")).Val(); n != 0 {
		t.Fatalf("the lock is still held after the adopter's Unlock")
	}
}

// A Lock that waits adopts the orphan too: calls started after the server
// continued get the lock within their second, one at a time.
func TestWaitersAdoptAnAbandonedAttempt(t *testing.T) {
	srv, c, admin, l := orphanRig(t)
	gate := mutex.NewGate("return {1}")
	ctx := context.Background()
	if lk, _, err := l.LockWith(ctx, "name", mutex.Call{Fragment: gate}); err != nil {
		t.Fatal(err)
	} else if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	idleConns(t, c, 8)
	thaw := testutil.Freeze(t, srv.Pid())
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, _, err := l.LockWith(short, "name", mutex.Call{Fragment: gate})
	cancel()
	if err == nil {
		t.Fatal("LockWith on a stopped server succeeded")
	}
	thawPastDeadline(thaw)
	if !heldWithin(admin, l.LockKey("name"), 2*time.Second) {
		t.Fatalf("the abandoned attempt took no lock: the test proves nothing")
	}
	var holders, overlaps, failed atomic.Int32
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			var lk *mutex.Lock
			var err error
			if i%2 == 0 {
				lk, _, err = l.LockWith(ctx, "name", mutex.Call{Fragment: gate})
			} else {
				lk, err = l.Lock(ctx, "name")
			}
			if err != nil {
				failed.Add(1)
				t.Errorf("caller %d: %v", i, err)
				return
			}
			if holders.Add(1) > 1 {
				overlaps.Add(1)
			}
			time.Sleep(time.Millisecond)
			holders.Add(-1)
			if err := lk.Unlock(context.Background()); err != nil {
				t.Errorf("caller %d: Unlock: %v", i, err)
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 || overlaps.Load() > 0 {
		t.Fatalf("%d of 16 callers failed, %d overlapped; want none", failed.Load(), overlaps.Load())
	}
}

// A release that hands the lock to a waiting goroutine through Redis (under
// the waiter's fresh token), cut short on a stopped server, runs when the
// server continues: the waiter, told it got nothing, adopts the lock under
// that token instead of waiting out its lease.
func TestWaiterAdoptsAnAbandonedHandOver(t *testing.T) {
	srv, c, admin, l := orphanRig(t)
	ctx := context.Background()
	commit := mutex.Call{Fragment: mutex.NewFragment("return 1")}
	// The fragment's script loaded, so that the release sent below runs
	// when the server continues (an EVALSHA the server does not know would
	// not: the lock would still be the holder's, rightly).
	if lk, err := l.Lock(ctx, "other"); err != nil {
		t.Fatal(err)
	} else if _, err := lk.UnlockWith(ctx, commit); err != nil {
		t.Fatal(err)
	}
	holder, err := l.Lock(ctx, "name")
	if err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		lk  *mutex.Lock
		err error
	}
	got := make(chan outcome, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		lk, err := l.Lock(wctx, "name")
		got <- outcome{lk, err}
	}()
	for l.Waiters("name") == 0 {
		time.Sleep(time.Millisecond)
	}
	idleConns(t, c, 8)
	thaw := testutil.Freeze(t, srv.Pid())
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	// A fragment's release always goes through Redis: the waiter's token.
	_, err = holder.UnlockWith(short, commit)
	cancel()
	if err == nil {
		t.Fatal("UnlockWith on a stopped server succeeded")
	}
	thawPastDeadline(thaw)
	w := <-got
	if w.err != nil {
		t.Fatalf("the waiter, after the server continued: %v; want the lock the release handed it", w.err)
	}
	// The holder's release, made again as the protocol asks, is answered
	// from its record, and leaves the adopted lock alone.
	if _, err := holder.UnlockWith(ctx, commit); err != nil && !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("the holder's release again: %v", err)
	}
	if n := admin.Exists(ctx, l.LockKey("name")).Val(); n != 1 {
		t.Fatalf("the holder's repeated release freed the lock its waiter adopted")
	}
	if err := w.lk.Unlock(ctx); err != nil {
		t.Fatalf("the waiter's Unlock: %v", err)
	}
	if n := admin.Exists(ctx, l.LockKey("name")).Val(); n != 0 {
		t.Fatalf("the lock is still held after the waiter's Unlock")
	}
}

// idleConns leaves n connections idle in c's pool: a command sent to a
// stopped server on a new connection waits for its handshake's reply and
// is never sent; on an idle one it is, and runs when the server continues.
// orphanLease is the lease of the orphan tests' Locker: longer than any of
// them runs, so that only adoption can free a lock taken by nobody.
const orphanLease = 10 * time.Second

// orphanRig starts a server of the test's own and returns it, a client of
// it that honours deadlines (it drops the connection of a call that gives
// up: no late reply will ever tell what the attempt did), an admin client,
// and a Locker on the first client with orphanLease.
func orphanRig(t *testing.T) (*testutil.Server, *redis.Client, *redis.Client, *mutex.Locker) {
	t.Helper()
	testutil.NeedServer(t)
	srv := testutil.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return srv, c, srv.Client(t), mustNew(t, c, mutex.WithPrefix(testutil.NewPrefix()), mutex.WithTTL(orphanLease))
}

func idleConns(t *testing.T, c *redis.Client, n int) {
	t.Helper()
	conns := make([]*redis.Conn, n)
	for i := range conns {
		conns[i] = c.Conn()
		if err := conns[i].Ping(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, cn := range conns {
		cn.Close()
	}
}

// heldWithin reports whether key exists, waiting up to d for it.
func heldWithin(c *redis.Client, key string, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if c.Exists(context.Background(), key).Val() == 1 {
			return true
		}
	}
	return false
}

// thawPastDeadline continues the server 100 ms after the abandoned call
// returned, so that the call's own read of the reply, which runs on in a
// goroutine of its own since a cancellable call hands off (issue 42), has
// met its deadline first: the outcome stays unknown, and the attempt an
// orphan to adopt. Continued at once, the server's reply could reach that
// read in time, and the call's undo release the lock at once (what a
// client should do, but not the case these tests are for: "the abandoned
// attempt took no lock", 1 of 16 runs).
func thawPastDeadline(thaw func()) {
	time.Sleep(100 * time.Millisecond)
	thaw()
}
