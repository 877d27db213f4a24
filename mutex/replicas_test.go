package mutex_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// ackWrite is a fragment that writes its key under the lock.
var ackWrite = mutex.NewFragment(`redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000) return 1`)

// replicaHas reports whether key on the replica holds want: a value, or a
// lock's token (somewhere in its value: where is value.go's business).
func replicaHas(t *testing.T, c *redis.Client, key, want string) bool {
	t.Helper()
	v, err := c.Get(context.Background(), key).Result()
	if err != nil && err != redis.Nil {
		t.Fatalf("GET %s on the replica: %v", key, err)
	}
	return err == nil && strings.Contains(v, want)
}

// ackBound is the WAIT bound of the tests that freeze a replica: every call
// waits that long then.
const ackBound = 200 * time.Millisecond

// lockAcked locks name before a replica is frozen, trying again while a
// loaded machine keeps the healthy replica's acknowledgement over the bound.
func lockAcked(t *testing.T, ctx context.Context, l *mutex.Locker, name string) *mutex.Lock {
	t.Helper()
	for {
		lk, err := l.Lock(ctx, name)
		if err == nil {
			return lk
		}
		if !errors.Is(err, mutex.ErrNotReplicated) {
			t.Fatalf("Lock %q before the freeze: %v", name, err)
		}
	}
}

// With WithReplicaAck, a lock is on the replica by the time Lock returns,
// and so are an extension and a fragment's write by the time they return.
func TestReplicaAckWritesReachTheReplica(t *testing.T) {
	r := testutil.StartReplicated(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rec := &testutil.CommandRecorder{}
	c := r.Master.Client(t)
	c.AddHook(rec)
	rc := r.Replicas[0].Client(t)
	l := mustNew(t, c, mutex.WithReplicaAck(1, 5*time.Second))
	if n, d := l.ReplicaAck(); n != 1 || d != 5*time.Second {
		t.Fatalf("ReplicaAck() = %d, %v", n, d)
	}
	for i := range 21 { // each of them, not one lucky one
		if i == 1 {
			rec.Reset() // the first cycle loaded the scripts (NOSCRIPT, then EVAL)
		}
		name := "a" + string(rune('a'+i))
		lk, err := l.Lock(ctx, name)
		if err != nil {
			t.Fatalf("Lock: %v", err)
		}
		if !replicaHas(t, rc, l.LockKey(name), lk.Token()) {
			t.Fatalf("Lock %q returned before the replica had it", name)
		}
		if err := lk.Extend(ctx, time.Minute); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		if ms, err := rc.PTTL(ctx, l.LockKey(name)).Result(); err != nil || ms < 30*time.Second {
			t.Fatalf("PTTL on the replica after Extend(1m) = %v, %v", ms, err)
		}
		data := mustKey(t, l, name, "data")
		if _, err := lk.UnlockWith(ctx, mutex.Call{Fragment: ackWrite, Keys: []string{data}, Args: []any{"v" + name}}); err != nil {
			t.Fatalf("UnlockWith: %v", err)
		}
		if !replicaHas(t, rc, data, "v"+name) {
			t.Fatalf("UnlockWith %q returned before the replica had its write", name)
		}
	}
	// WAIT rides with the script: Lock, Extend and UnlockWith are one round
	// trip each, one WAIT each.
	waits, trips := 0, map[int]bool{}
	for _, cmd := range rec.Commands() {
		trips[cmd.Trip] = true
		if cmd.Name == "wait" {
			waits++
		}
	}
	if waits != 60 || len(trips) != 60 {
		t.Fatalf("%d WAITs in %d round trips for 20 x (Lock, Extend, UnlockWith), want 60 in 60", waits, len(trips))
	}
}

// A replica that acknowledges nothing: grants fail with ErrNotReplicated and
// are undone; a plain Unlock still works (it waits for no replica).
func TestReplicaAckFrozenReplica(t *testing.T) {
	r, ctx, l := ackedRig(t, mutex.WithRetryInterval(5*time.Millisecond))
	c := r.Master.Client(t)
	held, held2 := lockAcked(t, ctx, l, "held"), lockAcked(t, ctx, l, "held2")
	thaw := testutil.Freeze(t, r.Replicas[0].Pid())
	defer thaw()

	if _, err := l.TryLock(ctx, "a"); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("TryLock with a frozen replica: %v, want ErrNotReplicated", err)
	}
	if n := c.Exists(ctx, l.LockKey("a")).Val(); n != 0 {
		t.Fatal("the unacknowledged lock was left on the master")
	}
	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := l.Lock(lctx, "a")
	lcancel()
	if !errors.Is(err, mutex.ErrNotReplicated) || errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("Lock with a frozen replica: %v, want ErrNotReplicated at once", err)
	}
	if _, _, err := l.TryLockWith(ctx, "b", mutex.Call{Fragment: ackWrite, Keys: []string{mustKey(t, l, "b", "data")}, Args: []any{"x"}}); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("TryLockWith with a frozen replica: %v, want ErrNotReplicated", err)
	}
	if n := c.Exists(ctx, l.LockKey("b")).Val(); n != 0 {
		t.Fatal("the unacknowledged lock of TryLockWith was left on the master")
	}
	if err := held.Extend(ctx, time.Minute); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("Extend with a frozen replica: %v, want ErrNotReplicated", err)
	}
	if _, err := held2.UnlockWith(ctx, mutex.Call{Fragment: ackWrite, Keys: []string{mustKey(t, l, "held2", "data")}, Args: []any{"y"}}); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("UnlockWith with a frozen replica: %v, want ErrNotReplicated", err)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatalf("a plain Unlock with a frozen replica: %v", err)
	}
	thaw()
	// Once the replica answers again, so does the Locker.
	if err := lockAcked(t, ctx, l, "a").Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A hand-over in Redis that no replica acknowledged is undone: the waiter
// tries again, itself waiting for the replica, and fails.
func TestReplicaAckHandOverUndone(t *testing.T) {
	r, ctx, l := ackedRig(t, mutex.WithRetryInterval(time.Hour))
	c := r.Master.Client(t)
	lk := lockAcked(t, ctx, l, "h")
	got := make(chan error, 1)
	go func() {
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		w, err := l.Lock(wctx, "h")
		if err == nil {
			_ = w.Unlock(ctx)
		}
		got <- err
	}()
	for mutex.QueueLen(l, "h") == 0 {
		select {
		case err := <-got:
			t.Fatalf("the waiter's Lock returned before the release: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	thaw := testutil.Freeze(t, r.Replicas[0].Pid())
	defer thaw()
	// UnlockWith hands over in Redis (never locally): the waiter's grant
	// rides on this script.
	if _, err := lk.UnlockWith(ctx, mutex.Call{Fragment: ackWrite, Keys: []string{mustKey(t, l, "h", "data")}, Args: []any{"z"}}); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("UnlockWith with a frozen replica: %v, want ErrNotReplicated", err)
	}
	if err := <-got; !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("the waiter's Lock: %v, want ErrNotReplicated", err)
	}
	if n := c.Exists(ctx, l.LockKey("h")).Val(); n != 0 {
		t.Fatal("the unacknowledged hand-over left the lock held")
	}
}

// Options that cannot work are refused up front.
func TestReplicaAckBadOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true}) // never dialled
	defer c.Close()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	c2 := redis.NewClient(&redis.Options{Addr: "127.0.0.1:2", ContextTimeoutEnabled: true})
	defer c2.Close()
	c3 := redis.NewClient(&redis.Options{Addr: "127.0.0.1:3", ContextTimeoutEnabled: true})
	defer c3.Close()
	for _, tc := range []struct {
		name   string
		client mutex.Client
		opt    mutex.Option
		want   error
	}{
		{"no replica", c, mutex.WithReplicaAck(0, time.Second), mutex.ErrInvalid},
		{"negative", c, mutex.WithReplicaAck(-1, time.Second), mutex.ErrInvalid},
		{"no bound", c, mutex.WithReplicaAck(1, 0), mutex.ErrInvalid},
		{"sub-millisecond bound", c, mutex.WithReplicaAck(1, time.Microsecond), mutex.ErrInvalid},
		{"ring", ring, mutex.WithReplicaAck(1, time.Second), mutex.ErrUnsupported},
		{"scripter only", scripterOnly{c}, mutex.WithReplicaAck(1, time.Second), mutex.ErrUnsupported},
	} {
		if l, err := mutex.New(tc.client, tc.opt); !errors.Is(err, tc.want) || l != nil {
			t.Errorf("%s: New = %v, %v; want nil, %v", tc.name, l, err, tc.want)
		}
	}
}

// scripterOnly is a client wrapper with scripts and nothing else.
type scripterOnly struct{ redis.Scripter }

// The planted failover of RELIABILITY.md, with and without WithReplicaAck:
// a lock taken after the replica was cut off exists on the old master only.
// A plain Locker grants it, and after the failover another owner gets the
// same lock while the first still holds it: one double grant. With
// WithReplicaAck the same Lock fails (ErrNotReplicated) and is undone, so
// the lock the other owner gets after the failover was nobody's: none.
func TestReplicaAckFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a master and waits for the failover: seconds")
	}
	g := testutil.StartSentinel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := g.Prefix(t)
	newClient := func() *redis.Client {
		return g.ClientOpts(t, &redis.FailoverOptions{DialTimeout: 300 * time.Millisecond, ReadTimeout: 3 * time.Second, WriteTimeout: time.Second})
	}
	lease := mutex.WithTTL(time.Minute) // outlasts the failover on a loaded machine
	acked := mustNew(t, newClient(), mutex.WithPrefix(prefix), mutex.WithReplicaAck(1, time.Second))
	plain := mustNew(t, newClient(), mutex.WithPrefix(prefix))
	var kept *mutex.Lock
	for kept == nil { // acknowledged before the cut
		lk, err := acked.Lock(ctx, "kept", lease)
		if err != nil && !errors.Is(err, mutex.ErrNotReplicated) {
			t.Fatalf("Lock(kept): %v", err)
		}
		kept = lk
	}
	g.DetachReplicas(t)
	holders := map[string]*mutex.Lock{} // what each Locker says it holds
	if lk, err := plain.Lock(ctx, "plain", lease); err != nil {
		t.Fatalf("plain Lock after the cut: %v", err)
	} else {
		holders["plain"] = lk
	}
	if lk, err := acked.Lock(ctx, "acked", lease); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("Lock with WithReplicaAck after the cut: %v, want ErrNotReplicated", err)
	} else if lk != nil {
		holders["acked"] = lk
	}
	if n := g.Master(t).Client(t).Exists(ctx, acked.LockKey("acked")).Val(); n != 0 {
		t.Fatal("the unacknowledged lock was left on the old master")
	}
	if _, took := g.KillMaster(t); took > 0 {
		t.Logf("failover took %v", took)
	}
	other := mustNew(t, newClient(), mutex.WithPrefix(prefix))
	tryLock := func(name string) error {
		for {
			_, err := other.TryLock(ctx, name, lease)
			if err == nil || errors.Is(err, mutex.ErrLocked) || ctx.Err() != nil {
				return err
			}
			time.Sleep(20 * time.Millisecond) // the client finds the new master
		}
	}
	if err := tryLock("kept"); !errors.Is(err, mutex.ErrLocked) {
		t.Errorf("TryLock(kept) on the new master: %v, want ErrLocked (the replica acknowledged it)", err)
	}
	doubles := map[string]int{}
	for _, name := range []string{"plain", "acked"} {
		err := tryLock(name)
		if err != nil && !errors.Is(err, mutex.ErrLocked) {
			t.Fatalf("TryLock(%s) on the new master: %v", name, err)
		}
		if err == nil && holders[name] != nil {
			doubles[name]++ // granted while the first holder still holds it
		}
	}
	t.Logf("double grants across the failover: plain Locker %d, WithReplicaAck %d", doubles["plain"], doubles["acked"])
	if doubles["plain"] != 1 {
		t.Errorf("plain Locker: %d double grants, want the planted 1 (the test's premise failed)", doubles["plain"])
	}
	if doubles["acked"] != 0 {
		t.Errorf("WithReplicaAck: %d double grants, want 0", doubles["acked"])
	}
}

// In a cluster the WAIT goes to the master of the key's slot: with the
// replica of one master frozen, locks whose names hash to that master fail
// with ErrNotReplicated, and every other lock is granted.
func TestReplicaAckCluster(t *testing.T) {
	rc := testutil.StartReplicatedCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := rc.Client(t)
	l := mustNew(t, c, mutex.WithReplicaAck(1, ackBound))
	names := make([]string, 24)
	for i := range names {
		names[i] = "c" + string(rune('a'+i))
	}
	for _, name := range names {
		if err := lockAcked(t, ctx, l, name).Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	frozen := rc.ReplicaOf(t, l.LockKey(names[0]))
	replicaOf := map[string]*testutil.Server{}
	for _, name := range names {
		replicaOf[name] = rc.ReplicaOf(t, l.LockKey(name))
	}
	thaw := testutil.Freeze(t, frozen.Pid())
	defer thaw()
	failed, granted := 0, 0
	for _, name := range names {
		lk, err := l.TryLock(ctx, name)
		onFrozen := replicaOf[name] == frozen
		switch {
		case onFrozen && errors.Is(err, mutex.ErrNotReplicated):
			failed++
		case !onFrozen && err == nil:
			granted++
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("TryLock(%q), its master's replica frozen %v: %v", name, onFrozen, err)
		}
	}
	if failed == 0 || granted == 0 {
		t.Fatalf("%d locks on the frozen replica's master failed, %d elsewhere granted: want some of each", failed, granted)
	}
}

// A hung master: every call of a Locker with WithReplicaAck returns by its
// context's deadline, on a client that honours deadlines and on one that
// does not (the call then returns from its own goroutine).
func TestReplicaAckHungServer(t *testing.T) {
	r := testutil.StartReplicated(t, 1)
	for _, honours := range []bool{true, false} {
		c := redis.NewClient(&redis.Options{Addr: r.Master.Addr, ContextTimeoutEnabled: honours})
		defer c.Close()
		l := mustNew(t, c, mutex.WithReplicaAck(1, time.Second))
		held := lockAcked(t, context.Background(), l, "held")
		thaw := testutil.Freeze(t, r.Master.Pid())
		for name, call := range map[string]func(ctx context.Context) error{
			"TryLock": func(ctx context.Context) error { _, err := l.TryLock(ctx, "x"); return err },
			"Lock":    func(ctx context.Context) error { _, err := l.Lock(ctx, "y"); return err },
			"Extend":  func(ctx context.Context) error { return held.Extend(ctx, time.Minute) },
			"UnlockWith": func(ctx context.Context) error {
				_, err := held.UnlockWith(ctx, mutex.Call{Fragment: ackWrite, Keys: []string{mustKey(t, l, "held", "data")}, Args: []any{"v"}})
				return err
			},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			start := time.Now()
			err := call(ctx)
			took := time.Since(start)
			cancel()
			// A bound against a hang, with room for a loaded machine; not
			// a measure of speed.
			if err == nil || took > 300*time.Millisecond+time.Second {
				t.Errorf("%s on a hung master (ContextTimeoutEnabled %v): %v after %v; want an error by the deadline", name, honours, err, took)
			}
			t.Logf("%s on a hung master (ContextTimeoutEnabled %v): returned after %v", name, honours, took.Round(100*time.Microsecond))
		}
		thaw()
	}
}

// WithAckAtRelease: the acquisition waits for no replica, the UnlockWith that
// ends the hold does, and reports what the replica did not acknowledge.
func TestReplicaAckAtRelease(t *testing.T) {
	r, ctx, l := ackedRig(t)
	lockAcked(t, ctx, l, "warm").Unlock(ctx) // the scripts loaded while the replica answers
	thaw := testutil.Freeze(t, r.Replicas[0].Pid())
	defer thaw()
	lk, _, err := l.TryLockWith(ctx, "a", mutex.Call{Fragment: ackWrite, Keys: []string{mustKey(t, l, "a", "data")}, Args: []any{"x"}}, mutex.WithAckAtRelease())
	if err != nil {
		t.Fatalf("TryLockWith(WithAckAtRelease) with a frozen replica: %v; want the lock, unacknowledged", err)
	}
	if _, err := lk.UnlockWith(ctx, mutex.Call{Fragment: ackWrite, Keys: []string{mustKey(t, l, "a", "data")}, Args: []any{"y"}}); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("its UnlockWith: %v, want ErrNotReplicated", err)
	}
	if _, err := l.TryLock(ctx, "b"); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("a TryLock without WithAckAtRelease: %v, want ErrNotReplicated", err)
	}
}

// ackedRig starts a master with one replica in sync and returns it, a
// context of 30 s, and a Locker on the master made with opts that waits
// for the replica (WithReplicaAck(1, ackBound)).
func ackedRig(t *testing.T, opts ...mutex.Option) (*testutil.Replicated, context.Context, *mutex.Locker) {
	t.Helper()
	r := testutil.StartReplicated(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	l := mustNew(t, r.Master.Client(t), append([]mutex.Option{mutex.WithReplicaAck(1, ackBound)}, opts...)...)
	return r, ctx, l
}
