package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// permitAcked takes n permits of s, trying again while the replica has not
// acknowledged (it may be catching up).
func permitAcked(t *testing.T, ctx context.Context, s *mutex.Semaphore, n int64) *mutex.Permit {
	t.Helper()
	for {
		p, err := s.TryAcquire(ctx, n, mutex.WithTTL(time.Minute))
		switch {
		case err == nil:
			return p
		case !errors.Is(err, mutex.ErrNotReplicated):
			t.Fatalf("TryAcquire(%d): %v", n, err)
		}
	}
}

// A replica that acknowledges nothing: acquisitions fail with
// ErrNotReplicated and give their permits back (Acquire at once), Extend
// fails with it; a Release still works (it waits for no replica).
func TestSemaphoreReplicaAckFrozenReplica(t *testing.T) {
	r, ctx, l := ackedRig(t, mutex.WithRetryInterval(5*time.Millisecond))
	c := r.Master.Client(t)
	s := mustSem(t, l, "sms", 3)
	held := permitAcked(t, ctx, s, 1)
	thaw := testutil.Freeze(t, r.Replicas[0].Pid())
	defer thaw()

	if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("TryAcquire with a frozen replica: %v, want ErrNotReplicated", err)
	}
	if got, _ := semHeld(t, c, s); got != 1 {
		t.Fatalf("the master holds %d permits after the unacknowledged grant, want 1", got)
	}
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := s.Acquire(actx, 2)
	acancel()
	if !errors.Is(err, mutex.ErrNotReplicated) || errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("Acquire with a frozen replica: %v, want ErrNotReplicated at once", err)
	}
	if got, _ := semHeld(t, c, s); got != 1 {
		t.Fatalf("the master holds %d permits after the unacknowledged Acquire, want 1", got)
	}
	before := mutex.PermitDeadline(held)
	if err := held.Extend(ctx, time.Hour); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("Extend with a frozen replica: %v, want ErrNotReplicated", err)
	}
	if after := mutex.PermitDeadline(held); !after.Equal(before) {
		t.Fatalf("an unacknowledged Extend moved the Permit's deadline from %v to %v", before, after)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release with a frozen replica: %v", err)
	}
	thaw()
	if err := permitAcked(t, ctx, s, 3).Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter granted by another's release (in Redis, announced on Pub/Sub)
// confirms the grant with its replicas before it returns: with the replica
// frozen, Acquire fails with ErrNotReplicated and gives the permits back.
func TestSemaphoreReplicaAckGrantUndone(t *testing.T) {
	r, ctx, l := ackedRig(t, mutex.WithRetryInterval(time.Hour))
	c := r.Master.Client(t)
	s := mustSem(t, l, "sms", 2)
	p := permitAcked(t, ctx, s, 2)
	// Frozen first, so that each poll of the waiter takes the WAIT's bound:
	// its second poll (after it subscribed) is seen by its new wait lease.
	thaw := testutil.Freeze(t, r.Replicas[0].Pid())
	defer thaw()
	got := make(chan error, 1)
	go func() {
		w, err := s.Acquire(ctx, 1, mutex.WithTTL(time.Hour))
		if err == nil {
			_ = w.Release(ctx)
		}
		got <- err
	}()
	alive := func() float64 { // the head waiter's wait-lease end
		q := c.ZRange(ctx, mutex.SemKey(s, "sem:queue"), 0, 0).Val()
		if len(q) == 0 {
			return 0
		}
		return c.ZScore(ctx, mutex.SemKey(s, "sem:ends"), q[0]).Val()
	}
	first := 0.0
	for first == 0 || alive() == first || c.PubSubNumSub(ctx, mutex.SemKey(s, "sem:granted")).Val()[mutex.SemKey(s, "sem:granted")] == 0 {
		if first == 0 {
			first = alive()
		}
		select {
		case err := <-got:
			t.Fatalf("the waiter's Acquire returned before the release: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	// The waiter polled after it subscribed: the grant reaches it by Pub/Sub.
	if err := p.Release(ctx); err != nil {
		t.Fatalf("Release with a frozen replica: %v", err)
	}
	if err := <-got; !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("the granted waiter's Acquire: %v, want ErrNotReplicated", err)
	}
	if got, _ := semHeld(t, c, s); got != 0 {
		t.Fatalf("the unacknowledged grant left %d permits held", got)
	}
}

// The planted failover of TestReplicaAckFailover, for a semaphore of 2:
// one permit of each semaphore is acknowledged before the replicas are cut
// off; after the cut a plain Locker takes the second permit of "plain",
// and a Locker WithReplicaAck fails to take the second of "acked". After
// the failover another Locker takes what the new master says is free:
// the plain semaphore has 3 holders (the planted excess), the acknowledged
// one 2.
func TestSemaphoreReplicaAckFailover(t *testing.T) {
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
	acked := mustNew(t, newClient(), mutex.WithPrefix(prefix), mutex.WithReplicaAck(1, time.Second))
	plain := mustNew(t, newClient(), mutex.WithPrefix(prefix))
	believed := map[string]int{} // permits their holders believe they hold
	for _, name := range []string{"acked", "plain"} {
		permitAcked(t, ctx, mustSem(t, acked, name, 2), 1)
		believed[name]++
	}
	g.DetachReplicas(t)
	if _, err := mustSem(t, plain, "plain", 2).TryAcquire(ctx, 1, mutex.WithTTL(time.Minute)); err != nil {
		t.Fatalf("plain TryAcquire after the cut: %v", err)
	}
	believed["plain"]++
	if _, err := mustSem(t, acked, "acked", 2).TryAcquire(ctx, 1, mutex.WithTTL(time.Minute)); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("TryAcquire WithReplicaAck after the cut: %v, want ErrNotReplicated", err)
	}
	if _, took := g.KillMaster(t); took > 0 {
		t.Logf("failover took %v", took)
	}
	other := mustNew(t, newClient(), mutex.WithPrefix(prefix))
	for _, name := range []string{"acked", "plain"} {
		s := mustSem(t, other, name, 2)
		for ctx.Err() == nil {
			_, err := s.TryAcquire(ctx, 1, mutex.WithTTL(time.Minute))
			if errors.Is(err, mutex.ErrNoPermits) {
				break
			}
			if err == nil {
				believed[name]++
				continue
			}
			time.Sleep(20 * time.Millisecond) // the client finds the new master
		}
	}
	t.Logf("permits held across the failover of a semaphore of 2: plain %d, WithReplicaAck %d", believed["plain"], believed["acked"])
	if believed["plain"] != 3 {
		t.Errorf("plain Locker: %d permits held, want the planted 3 (the test's premise failed)", believed["plain"])
	}
	if believed["acked"] != 2 {
		t.Errorf("WithReplicaAck: %d permits held, want 2", believed["acked"])
	}
}
