package mutex_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// Recover at once, even from an orphan that runs late: an abandoned attempt
// whose command the server reads only after the Locker's next attempt
// adopted its token by a fresh SET NX and released the lock (a starved or
// stopped server, the bytes waiting in its socket buffer) takes the lock
// again under that token. The Locker remembers the token as spent, and its
// next attempt that finds the lock held under it deletes it and takes the
// lock (TryLock, and Lock without waiting out the orphan's lease), while a
// lock another owner holds is left alone.
func TestLateOrphanAfterAdoptionIsCleared(t *testing.T) {
	for _, tc := range []struct {
		name string
		lock func(context.Context, *mutex.Locker) (*mutex.Lock, error)
	}{
		{"TryLock", func(ctx context.Context, l *mutex.Locker) (*mutex.Lock, error) { return l.TryLock(ctx, "name") }},
		{"Lock", func(ctx context.Context, l *mutex.Locker) (*mutex.Lock, error) {
			ctx, cancel := context.WithTimeout(ctx, orphanLease/2) // before: it waits out the lease
			defer cancel()
			return l.Lock(ctx, "name")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, admin, l, other := lateOrphan(t)
			ctx := context.Background()
			if err := adopt(t, l).Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			// Held by another owner: the spent token's check leaves it.
			olk, err := other.TryLock(ctx, "name")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.TryLock(ctx, "name"); !errors.Is(err, mutex.ErrLocked) {
				t.Fatalf("TryLock of a lock another owner holds = %v, want ErrLocked", err)
			}
			if err := olk.Unlock(ctx); err != nil {
				t.Fatalf("the other owner's Unlock: %v (its lock was deleted)", err)
			}
			// The abandoned attempt runs now, and takes the lock, held by nobody.
			runLate(t, d, admin, l)
			lk, err := tc.lock(ctx, l)
			if err != nil {
				t.Fatalf("after the late orphan ran: %v; want the lock at once (the orphan's token was spent)", err)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if admin.Exists(ctx, l.LockKey("name")).Val() != 0 {
				t.Fatal("the lock is still held after the Unlock")
			}
		})
	}
}

// lateOrphan sets up an orphan that runs late: on a server of the test's
// own, through a staleDialer, a TryLock of "name" whose command is held
// back while its caller leaves. It returns the dialer, whose deliver runs
// the orphan (runLate), an admin client, the Locker and another Locker of
// the same keys (another process).
func lateOrphan(t *testing.T) (*staleDialer, *redis.Client, *mutex.Locker, *mutex.Locker) {
	t.Helper()
	testutil.NeedServer(t)
	srv := testutil.StartServer(t)
	d := &staleDialer{}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, Dialer: d.dial})
	t.Cleanup(func() { c.Close() })
	admin := srv.Client(t)
	prefix := testutil.NewPrefix()
	l := mustNew(t, c, mutex.WithPrefix(prefix), mutex.WithTTL(orphanLease))
	ctx := context.Background()
	if lk, err := l.Lock(ctx, "name"); err != nil { // the scripts loaded
		t.Fatal(err)
	} else if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	idleConns(t, c, 8)
	d.setHold(true)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := l.TryLock(short, "name")
	cancel()
	d.setHold(false)
	if err == nil || errors.Is(err, mutex.ErrLocked) {
		t.Fatalf("TryLock whose command was held back = %v, want its deadline", err)
	}
	return d, admin, l, mustNew(t, srv.Client(t), mutex.WithPrefix(prefix), mutex.WithTTL(orphanLease))
}

// adopt is the attempt after lateOrphan's abandoned one: it adopts its
// token and takes the free lock fresh.
func adopt(t *testing.T, l *mutex.Locker) *mutex.Lock {
	t.Helper()
	lk, err := l.TryLock(context.Background(), "name")
	if err != nil {
		t.Fatalf("TryLock after the abandoned attempt: %v", err)
	}
	return lk
}

// runLate runs the orphan that d held back, and checks that it took the
// lock: else the test proves nothing.
func runLate(t *testing.T, d *staleDialer, admin *redis.Client, l *mutex.Locker) {
	t.Helper()
	if n := d.deliver(t); n == 0 {
		t.Fatal("no command was held back: the test proves nothing")
	}
	if admin.Exists(context.Background(), l.LockKey("name")).Val() != 1 {
		t.Fatal("the late attempt took no lock: the test proves nothing")
	}
}

// The adopted token handed to a local waiter without a round trip lives on
// in the waiter's handle: it is spent when that handle releases the lock.
func TestLateOrphanAfterLocalHandOverIsCleared(t *testing.T) {
	d, admin, l, _ := lateOrphan(t)
	ctx := context.Background()
	lk := adopt(t, l)
	got := make(chan *mutex.Lock, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		w, err := l.Lock(wctx, "name")
		if err != nil {
			t.Errorf("the waiter: %v", err)
		}
		got <- w
	}()
	for l.Waiters("name") == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-got
	if w == nil {
		t.FailNow()
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	runLate(t, d, admin, l)
	lk, err := l.TryLock(ctx, "name")
	if err != nil {
		t.Fatalf("TryLock after the late orphan ran: %v; want the lock at once (the token the waiter released was spent)", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A staleDialer dials connections whose writes, while it holds, are kept
// back instead of sent; go-redis, its reply timed out, closes such a
// connection, but the dialer keeps it open, and deliver sends what it kept:
// the command runs late, as one in a stopped server's socket buffer does.
type staleDialer struct {
	mu    sync.Mutex
	hold  bool
	stale []*staleConn
}

func (d *staleDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &staleConn{Conn: c, d: d}, nil
}

func (d *staleDialer) setHold(on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hold = on
}

func (d *staleDialer) holding() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hold
}

// deliver sends every closed connection's kept bytes, waits for the
// server's reply and closes the connection. It returns how many there were.
func (d *staleDialer) deliver(t *testing.T) int {
	t.Helper()
	d.mu.Lock()
	stale := d.stale
	d.stale = nil
	d.mu.Unlock()
	for _, c := range stale {
		_ = c.Conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Conn.Write(c.kept()); err != nil {
			t.Fatalf("late write: %v", err)
		}
		var buf [512]byte
		if _, err := c.Conn.Read(buf[:]); err != nil {
			t.Fatalf("late reply: %v", err)
		}
		c.Conn.Close()
	}
	return len(stale)
}

// A staleConn is a connection of a staleDialer.
type staleConn struct {
	net.Conn
	d   *staleDialer
	mu  sync.Mutex
	buf []byte
}

func (c *staleConn) Write(p []byte) (int, error) {
	if !c.d.holding() {
		return c.Conn.Write(p)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, p...)
	return len(p), nil
}

func (c *staleConn) Close() error {
	if len(c.kept()) == 0 {
		return c.Conn.Close()
	}
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.d.stale = append(c.d.stale, c)
	return nil
}

func (c *staleConn) kept() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf
}
