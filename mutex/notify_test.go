package mutex_test

import (
	"context"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// lockIn runs Lock in the background and reports the lock when it is acquired.
func lockIn(t *testing.T, l *mutex.Locker, name string) <-chan *mutex.Lock {
	got := make(chan *mutex.Lock, 1)
	go func() {
		lk, err := l.Lock(context.Background(), name)
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	return got
}

// subscribed waits until the server counts a subscriber of channel.
func subscribed(t *testing.T, b *testutil.Backend, channel string) {
	c := b.Client(t)
	waitFor(t, "subscription to "+channel, func() bool {
		return c.PubSubNumSub(context.Background(), channel).Val()[channel] > 0
	})
}

func expectLock(t *testing.T, got <-chan *mutex.Lock, within time.Duration, what string) {
	t.Helper()
	select {
	case lk := <-got:
		if lk != nil {
			lk.Unlock(context.Background())
		}
	case <-time.After(within):
		t.Fatalf("%s: no lock after %v", what, within)
	}
}

func TestReleaseNotificationWakesOtherProcess(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		holder, err := newLocker(t, b).Lock(ctx, "n", mutex.WithTTL(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		// The waiter would poll hourly and the lease lasts an hour: only the
		// notification can wake it in time.
		waiter := newLocker(t, b, mutex.WithRetryInterval(time.Hour))
		got := lockIn(t, waiter, "n")
		waitFor(t, "waiter to mark the lock", func() bool {
			return mutex.Marked(b.Client(t).Get(ctx, b.Prefix+"{n}:lock").Val()) && mutex.QueueLen(waiter, "n") == 1
		})
		subscribed(t, b, b.Prefix+"{n}:released")
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		expectLock(t, got, 5*time.Second, "notified waiter")
	})
}

func TestTickerWithoutNotifications(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		holder, err := newLocker(t, b).Lock(ctx, "n", mutex.WithTTL(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		waiter := newLocker(t, b, mutex.WithoutNotifications(), mutex.WithRetryInterval(5*time.Millisecond))
		got := lockIn(t, waiter, "n")
		waitFor(t, "waiter", func() bool { return mutex.QueueLen(waiter, "n") == 1 })
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		expectLock(t, got, 5*time.Second, "ticking waiter")
	})
}

// A lease that ends announces nothing: the waiter's wait, cut to the holder's
// remaining lease, still gets the lock.
func TestLostNotificationLeaseEnd(t *testing.T) {
	b := testutil.RealBackend(t) // miniredis leases end only by FastForward
	ctx := context.Background()
	if _, err := newLocker(t, b).Lock(ctx, "n", mutex.WithTTL(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	waiter := newLocker(t, b, mutex.WithRetryInterval(time.Hour))
	expectLock(t, lockIn(t, waiter, "n"), 5*time.Second, "waiter after the lease ended")
}

// scriptsOnly hides Subscribe: a client that cannot subscribe still works.
type scriptsOnly struct{ mutex.Client }

func TestClientWithoutSubscribe(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := scriptsOnly{b.Client(t)}
		holder, err := mustNew(t, c, mutex.WithPrefix(b.Prefix)).Lock(ctx, "n")
		if err != nil {
			t.Fatal(err)
		}
		waiter := mustNew(t, c, mutex.WithPrefix(b.Prefix), mutex.WithRetryInterval(5*time.Millisecond))
		got := lockIn(t, waiter, "n")
		waitFor(t, "waiter", func() bool { return mutex.QueueLen(waiter, "n") == 1 })
		holder.Unlock(ctx)
		expectLock(t, got, 5*time.Second, "waiter without Subscribe")
	})
}

func TestReleaseWithoutWaitersPublishesNothing(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		sub := b.Client(t).PSubscribe(ctx, b.Prefix+"*")
		defer sub.Close()
		if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
			t.Fatal(err)
		}
		l := newLocker(t, b)
		for range 10 {
			lk, err := l.Lock(ctx, "quiet")
			if err != nil {
				t.Fatal(err)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// Now with a waiter: exactly then a release is published. Receiving it
		// also proves no message came before it.
		holder, _ := l.Lock(ctx, "busy", mutex.WithTTL(time.Hour))
		other := newLocker(t, b, mutex.WithRetryInterval(time.Hour))
		got := lockIn(t, other, "busy")
		waitFor(t, "mark", func() bool { return mutex.Marked(b.Client(t).Get(ctx, b.Prefix+"{busy}:lock").Val()) })
		subscribed(t, b, b.Prefix+"{busy}:released")
		holder.Unlock(ctx)
		msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		m, ok := msg.(*redis.Message)
		if !ok || m.Channel != b.Prefix+"{busy}:released" {
			t.Fatalf("first message = %#v, want the release of busy (none for quiet)", msg)
		}
		expectLock(t, got, 5*time.Second, "waiter")
	})
}
