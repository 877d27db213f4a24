package reliability

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// Network faults between the client and Redis, through an in-process
// toxiproxy (Toxi). The holder talks to Redis through the proxy; the
// checker (a contender for the same lock) and the test's own reads go to the
// server directly, so they see what really happened.

// ctxClient is the go-redis configuration under which a ctx deadline bounds
// a call's socket I/O (go-redis ignores deadlines for I/O unless asked).
func ctxClient() *redis.Options { return &redis.Options{ContextTimeoutEnabled: true} }

// faultGrace is how late a holder's report of a lost lock may come after a
// contender took the lock: the deadline timer must be scheduled, on a shared
// and loaded 2-core machine under -race (the lag measured there is 0: the
// server's lease ends a round trip and a drift margin after the client's
// deadline). A silent loss is late for ever; a grace under the lease (300 ms
// in these tests) still catches a report a lease late.
const faultGrace = 250 * time.Millisecond

// TestNetLatencyDuringAutoRenew delays every reply while an WithAutoRenew lock
// is held: by half the lease (longer than the renewal period, lease/3, so
// every renewal reply comes late) and by a fifth of it. Whatever the client
// does with late replies, the lock is either kept (and the server agrees) or
// its loss is reported through Done and Context with cause ErrLockLost
// before, or within a scheduling grace of, the moment a contender on the
// server gets it: never two holders. No lock key outlives its lease once the
// holder stops.
// faultTries bounds the tries of a scenario whose fault can strike too
// early: reset_peer on the replies sometimes kills the connection before the
// request is out (EOF, nothing ran), and a loaded machine makes that more
// likely; each try is independent.
const faultTries = 10

func TestNetLatencyDuringAutoRenew(t *testing.T) {
	const lease = 300 * time.Millisecond
	defaults := func() *redis.Options { return &redis.Options{} }
	for _, tc := range []struct {
		name    string
		latency time.Duration
		opts    func() *redis.Options
		cold    bool // no warm-up: the renewal's first EVALSHA finds no script
	}{
		// Renewal bounds each attempt by a ctx of one period: with deadlines
		// honoured, every renewal times out, though it ran on the server.
		{"lease/2 ctx-deadlines", lease / 2, ctxClient, false},
		// Deadlines ignored for socket I/O (go-redis's default): renewals
		// succeed late, but the next one starts a period after the late
		// reply, and its reply comes after the lease the previous one set.
		{"lease/2 default-client", lease / 2, defaults, false},
		// The extend script is not cached yet (a fresh or failed-over
		// server): each renewal needs EVALSHA, then EVAL, two round trips
		// that do not fit in one period.
		{"lease/2 default-client cold-scripts", lease / 2, defaults, true},
		// Well within a period: the lock should be kept.
		{"lease/5 ctx-deadlines", lease / 5, ctxClient, false},
		{"lease/5 default-client", lease / 5, defaults, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			srv, admin := faultServer(t)
			x := StartToxi(t, srv.Addr)
			prefix := testutil.NewPrefix()
			_, _, lockKey := faultKeys(prefix, "job")
			holder := mustLocker(t, x.Client(t, tc.opts()), mutex.WithPrefix(prefix), mutex.WithTTL(lease))
			checker := mustLocker(t, admin, mutex.WithPrefix(prefix))
			if !tc.cold {
				faultWarm(t, holder, prefix)
			}

			lk, err := holder.Lock(ctx, "job", mutex.WithAutoRenew())
			if err != nil {
				t.Fatal(err)
			}
			owned := lk.Context(ctx)
			c := startFaultContender(t, checker, "job", lease, faultGrace, lk)
			defer c.halt()

			injected := time.Now()
			toxic := x.Latency(t, "downstream", tc.latency, 0)
			var lostAfter time.Duration = -1
			if faultWithin(lk.Done(), 5*lease) {
				lostAfter = time.Since(injected)
			}
			x.RemoveToxic(t, toxic)
			// Let the checker try a while longer: a lock lost on the server
			// but not reported would be taken now.
			time.Sleep(2 * lease)
			c.halt()
			wins, overlap, lag, _ := c.result()

			fault := "reply latency " + tc.name + " (" + tc.latency.String() + "), lease " + lease.String()
			// Read the server first: a handle still open after this read
			// must have a lock on the server at the time of the read (the
			// handle reports a loss before the server's lease ends).
			ttl, terr := admin.PTTL(ctx, lockKey).Result()
			switch {
			case faultClosed(lk.Done()):
				if cause := context.Cause(owned); !errors.Is(cause, mutex.ErrLockLost) {
					t.Errorf("lock ended with cause %v, want ErrLockLost", cause)
				}
				if err := lk.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
					t.Errorf("Unlock of a lost lock = %v, want ErrNotHeld", err)
				}
				if lostAfter >= 0 {
					faultFigure(t, "auto-renew: outcome", fault, "lost, reported %v after the fault began", lostAfter.Round(time.Millisecond))
				} else {
					faultFigure(t, "auto-renew: outcome", fault, "kept through %v of latency, lost after it ended", 5*lease)
				}
			default:
				if terr != nil || ttl <= 0 {
					t.Errorf("lock reported held after the latency, but the server has PTTL %v, %v: silently lost", ttl, terr)
				}
				if err := lk.Unlock(ctx); err != nil {
					t.Errorf("Unlock of a kept lock = %v", err)
				}
				faultFigure(t, "auto-renew: outcome", fault, "kept (%v of latency, contender acquired %d times)", 5*lease, wins)
			}
			faultFigure(t, "auto-renew: two holders seen by the checker", fault, "%d in %d contender acquisitions (max report lag %v)", overlap, wins, lag.Round(time.Millisecond))
			time.Sleep(50 * time.Millisecond) // a renewal sent just before the loss lands
			faultNoOrphan(t, admin, lockKey, lease)
		})
	}
}

// TestNetUnknownOutcome makes calls whose outcome the client cannot know:
// the request reaches Redis and runs, the reply is lost or late. Such a call
// returns an error, never success, and the handle is never treated as held
// on its strength: a lost Extend reply does not move the lease end the
// handle reports, a lost Unlock reply leaves a handle whose later commit is
// refused, a lost acquire reply returns no lock. Keys written by calls whose
// reply was lost expire within their lease.
func TestNetUnknownOutcome(t *testing.T) {
	t.Run("extend reply late", func(t *testing.T) {
		const lease, extended = 400 * time.Millisecond, 1500 * time.Millisecond
		ctx := context.Background()
		srv, admin := faultServer(t)
		x := StartToxi(t, srv.Addr)
		prefix := testutil.NewPrefix()
		_, _, lockKey := faultKeys(prefix, "job")
		holder := mustLocker(t, x.Client(t, ctxClient()), mutex.WithPrefix(prefix), mutex.WithTTL(lease))
		faultWarm(t, holder, prefix)
		acquired := time.Now()
		lk, err := holder.Lock(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		owned := lk.Context(ctx)
		// When the handle reports the loss, whatever the test is doing then.
		reportedAt := make(chan time.Time, 1)
		go func() { <-owned.Done(); reportedAt <- time.Now() }()
		x.Latency(t, "downstream", 300*time.Millisecond, 0)
		ectx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err = lk.Extend(ectx, extended)
		cancel()
		if err == nil || errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("Extend whose reply came after its deadline = %v, want a timeout", err)
		}
		// The scenario: the Extend ran on the server. Its request is on its
		// way (only replies are delayed); on a loaded machine it may land
		// after the caller gave up, so wait for it rather than read once.
		var ttl time.Duration
		if !faultUntil(func() bool { ttl = admin.PTTL(ctx, lockKey).Val(); return ttl > lease }) {
			t.Fatalf("server PTTL %v after the Extend: it did not land, the scenario did not run", ttl)
		}
		// The handle must still report the end of the lease it knows of.
		var reported time.Duration
		select {
		case at := <-reportedAt:
			reported = at.Sub(acquired)
		case <-time.After(lease + faultHang):
			t.Fatalf("handle still held %v after acquisition; the only lease it knows of was %v: an Extend of unknown outcome was treated as done",
				time.Since(acquired), lease)
		}
		if cause := context.Cause(owned); !errors.Is(cause, mutex.ErrLockLost) {
			t.Errorf("cause = %v, want ErrLockLost", cause)
		}
		if reported > extended-faultGrace {
			t.Errorf("loss reported %v after acquisition, past the lease the unknown Extend would have set (%v)", reported, extended)
		}
		faultFigure(t, "unknown Extend: handle reports loss at", "reply 300ms late, ctx 50ms, lease "+lease.String(), "%v after acquisition (server held it %v)", reported.Round(time.Millisecond), extended)
		if err := lk.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
			t.Errorf("Unlock after the reported loss = %v, want ErrNotHeld", err)
		}
		faultNoOrphan(t, admin, lockKey, extended)
	})

	t.Run("unlock reply lost", func(t *testing.T) {
		const lease = 2 * time.Second
		ctx := context.Background()
		srv, admin := faultServer(t)
		x := StartToxi(t, srv.Addr)
		prefix := testutil.NewPrefix()
		counter, log, lockKey := faultKeys(prefix, "job")
		holder := mustLocker(t, x.Client(t, ctxClient()), mutex.WithPrefix(prefix), mutex.WithTTL(lease))
		other := mustLocker(t, admin, mutex.WithPrefix(prefix))
		var lk *mutex.Lock
		// As for the acquire below: an Unlock that never left is retried.
		for try := 1; ; try++ {
			faultWarm(t, holder, prefix)
			var err error
			lk, err = holder.Lock(ctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			toxic := x.ResetPeer(t, "downstream")
			err = lk.Unlock(ctx)
			if err == nil || errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("Unlock whose reply was lost = %v, want a Redis error", err)
			}
			x.RemoveToxic(t, toxic)
			if admin.Exists(ctx, lockKey).Val() == 0 {
				break
			}
			if try == faultTries {
				t.Fatalf("the Unlock did not reach the server in %d tries (%v): the scenario did not run", faultTries, err)
			}
			t.Logf("try %d: the Unlock did not reach the server (%v)", try, err)
			if err := lk.Unlock(ctx); err != nil {
				t.Fatalf("Unlock after the toxic was removed: %v", err)
			}
		}
		// Someone else takes the free lock; the old handle, whose Unlock had
		// an unknown outcome, must not be able to commit.
		lk2, err := other.TryLock(ctx, "job", mutex.WithTTL(lease))
		if err != nil {
			t.Fatalf("TryLock after the release landed: %v", err)
		}
		if _, err := lk.UnlockWith(ctx, mutex.Call{Fragment: faultCommit, Keys: []string{counter, log}, Args: []any{1, "stale"}}); !errors.Is(err, mutex.ErrNotHeld) {
			t.Errorf("commit through the handle after its Unlock of unknown outcome = %v, want ErrNotHeld", err)
		}
		if n := admin.LLen(ctx, log).Val(); n != 0 {
			t.Errorf("%d stale writes landed", n)
		}
		if ttl, err := lk2.TTL(ctx); err != nil || ttl <= 0 {
			t.Errorf("the new holder's lock after the old handle's retry: TTL %v, %v; want still held", ttl, err)
		}
		if !faultClosed(lk.Done()) {
			t.Error("old handle's Done still open after ErrNotHeld")
		}
		faultFigure(t, "unknown Unlock: stale writes landed", "reset_peer on replies", "%d", admin.LLen(ctx, log).Val())
		if err := lk2.Unlock(ctx); err != nil {
			t.Error(err)
		}
	})

	t.Run("acquire reply lost", func(t *testing.T) {
		const lease = 500 * time.Millisecond
		ctx := context.Background()
		srv, admin := faultServer(t)
		x := StartToxi(t, srv.Addr)
		prefix := testutil.NewPrefix()
		_, _, lockKey := faultKeys(prefix, "job")
		holder := mustLocker(t, x.Client(t, ctxClient()), mutex.WithPrefix(prefix), mutex.WithTTL(lease))
		// Now and then the connection dies before the request is out (EOF
		// without the script having run): then it is not the scenario, and
		// is tried again on fresh connections.
		for try := 1; ; try++ {
			faultWarm(t, holder, prefix)
			toxic := x.ResetPeer(t, "downstream")
			lk, err := holder.TryLock(ctx, "job")
			if err == nil || lk != nil {
				t.Fatalf("TryLock whose reply was lost = %v, %v; want no lock and an error", lk, err)
			}
			if admin.Exists(ctx, lockKey).Val() == 1 {
				break
			}
			if try == faultTries {
				t.Fatalf("the acquire did not reach the server in %d tries (TryLock: %v): the scenario did not run", faultTries, err)
			}
			t.Logf("try %d: the acquire did not reach the server (%v)", try, err)
			x.RemoveToxic(t, toxic)
		}
		// Lock with a deadline: the errors end the wait, and it returns in time.
		const deadline = 300 * time.Millisecond
		took, lk, err := faultLockWithin(holder, "job", deadline)
		if err == nil || lk != nil {
			t.Fatalf("Lock with every reply lost = %v, %v; want an error", lk, err)
		}
		if took > deadline+time.Second {
			t.Errorf("Lock with a %v deadline returned after %v", deadline, took)
		}
		faultFigure(t, "lost acquire reply: Lock returns after", "reset_peer on replies, ctx "+deadline.String(), "%v (%v)", took.Round(time.Millisecond), err)
		// The lock the lost reply took belongs to nobody: its lease ends it.
		faultNoOrphan(t, admin, lockKey, lease)
	})

	t.Run("blackhole", func(t *testing.T) {
		if testing.Short() {
			t.Skip("waits for go-redis read timeouts")
		}
		const lease = 500 * time.Millisecond
		const deadline = 300 * time.Millisecond
		srv, admin := faultServer(t)
		x := StartToxi(t, srv.Addr)
		prefix := testutil.NewPrefix()
		_, _, lockKey := faultKeys(prefix, "job")
		for _, cfg := range []struct {
			name string
			o    *redis.Options
			// bound is the longest Lock may take: its deadline, or with
			// deadlines ignored for I/O, one read timeout per try.
			bound time.Duration
		}{
			{"ctx-deadlines", ctxClient(), deadline + time.Second},
			{"default-client, ReadTimeout 300ms, MaxRetries 1", &redis.Options{ReadTimeout: 300 * time.Millisecond, MaxRetries: 1}, 2*300*time.Millisecond + deadline + time.Second},
		} {
			holder := mustLocker(t, x.Client(t, cfg.o), mutex.WithPrefix(prefix), mutex.WithTTL(lease))
			faultWarm(t, holder, prefix)
			toxic := x.Blackhole(t, "downstream")
			took, lk, err := faultLockWithin(holder, "job", deadline)
			x.RemoveToxic(t, toxic)
			if err == nil || lk != nil {
				t.Fatalf("%s: Lock with no reply = %v, %v; want an error", cfg.name, lk, err)
			}
			if took > cfg.bound {
				t.Errorf("%s: Lock with a %v deadline returned after %v (bound %v)", cfg.name, deadline, took, cfg.bound)
			}
			faultFigure(t, "Lock bounded by its ctx deadline "+deadline.String(), "replies blackholed, "+cfg.name, "returned after %v", took.Round(time.Millisecond))
			faultNoOrphan(t, admin, lockKey, lease)
		}
	})
}

// A netRig is the set-up of a network fault test: a redis-server, an admin
// client straight to it, a toxiproxy in front of it, and on a client through
// the proxy a warmed-up Locker (lease as given) and a guard that fails
// closed within 200 ms.
type netRig struct {
	admin   *redis.Client
	x       *Toxi
	prefix  string
	lockKey string // the lock on "job"
	holder  *mutex.Locker
	g       *guard.Guard
}

func newNetRig(t *testing.T, lease time.Duration, o *redis.Options) *netRig {
	t.Helper()
	srv, admin := faultServer(t)
	r := &netRig{admin: admin, x: StartToxi(t, srv.Addr), prefix: testutil.NewPrefix()}
	_, _, r.lockKey = faultKeys(r.prefix, "job")
	pc := r.x.Client(t, o)
	r.holder = mustLocker(t, pc, mutex.WithPrefix(r.prefix), mutex.WithTTL(lease))
	faultWarm(t, r.holder, r.prefix)
	var err error
	r.g, err = guard.New(pc,
		guard.WithPrefix(r.prefix+"g:"),
		guard.WithTimeout(200*time.Millisecond),
		guard.WithRules(funnel.Rule{Name: "burst", Capacity: 1000, Leak: 1000, Per: time.Second}),
	)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestNetResetPeer resets every connection as its reply comes back, while an
// WithAutoRenew lock is held and a guard decides: renewals run on the server
// but their replies are lost, so the holder must report the loss (never
// two holders); the guard, failing closed, admits nothing while no reply
// arrives, even though its writes may have landed.
func TestNetResetPeer(t *testing.T) {
	const lease = 300 * time.Millisecond
	ctx := context.Background()
	r := newNetRig(t, lease, nil)
	admin, x, prefix, lockKey, holder, g := r.admin, r.x, r.prefix, r.lockKey, r.holder, r.g
	if d, err := g.Allow(ctx, "+100"); err != nil || !d.Allowed {
		t.Fatalf("guard before the fault: %+v, %v", d, err)
	}
	lk, err := holder.Lock(ctx, "job", mutex.WithAutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	owned := lk.Context(ctx)
	c := startFaultContender(t, mustLocker(t, admin, mutex.WithPrefix(prefix)), "job", lease, faultGrace, lk)
	defer c.halt()

	injected := time.Now()
	toxic := x.ResetPeer(t, "downstream")
	var allowed, decisions atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			d, err := g.Allow(ctx, "+100")
			decisions.Add(1)
			if d.Allowed {
				allowed.Add(1)
				t.Errorf("guard admitted while every reply was reset: %+v, %v", d, err)
			} else if err == nil || !errors.Is(err, guard.ErrUnavailable) {
				t.Errorf("guard denial without ErrUnavailable while every reply was reset: %+v, %v", d, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	lost := faultWithin(lk.Done(), lease+2*time.Second)
	lostAfter := time.Since(injected)
	time.Sleep(2 * lease) // the contender gets its chance
	close(stop)
	wg.Wait()
	x.RemoveToxic(t, toxic)
	c.halt()
	wins, overlap, lag, _ := c.result()
	if !lost {
		t.Fatalf("holder did not report the loss of a lock it could not renew for %v", lostAfter)
	}
	if cause := context.Cause(owned); !errors.Is(cause, mutex.ErrLockLost) {
		t.Errorf("cause = %v, want ErrLockLost", cause)
	}
	if err := lk.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Errorf("Unlock of the lost lock = %v, want ErrNotHeld", err)
	}
	if decisions.Load() == 0 {
		t.Fatal("no guard decision during the fault")
	}
	fault := "reset_peer on replies, lease " + lease.String()
	faultFigure(t, "auto-renew: loss reported after fault", fault, "%v", lostAfter.Round(time.Millisecond))
	faultFigure(t, "auto-renew: two holders seen by the checker", fault, "%d in %d contender acquisitions (max report lag %v)", overlap, wins, lag.Round(time.Millisecond))
	faultFigure(t, "guard FailClosed: admissions without a reply", fault, "%d of %d decisions", allowed.Load(), decisions.Load())
	if d, err := g.Allow(ctx, "+100"); err != nil || !d.Allowed {
		t.Errorf("guard after the fault: %+v, %v", d, err)
	}
	faultNoOrphan(t, admin, lockKey, lease)
}

// TestNetProxyDownUp takes the network away (the proxy stops listening and
// closes every connection) for several leases, then brings it back. While it
// is down: the WithAutoRenew holder reports the loss before a contender on the
// server gets the lock; Lock with a deadline returns within it; the guard
// admits nothing. Once it is up: the old handle's Unlock returns ErrNotHeld
// and leaves the new holder's lock alone, and locks and admissions work
// again (time to the first of each measured).
func TestNetProxyDownUp(t *testing.T) {
	const lease = 300 * time.Millisecond
	ctx := context.Background()
	r := newNetRig(t, lease, &redis.Options{DialTimeout: 200 * time.Millisecond})
	admin, x, prefix, lockKey, holder, g := r.admin, r.x, r.prefix, r.lockKey, r.holder, r.g
	checker := mustLocker(t, admin, mutex.WithPrefix(prefix))
	lk, err := holder.Lock(ctx, "job", mutex.WithAutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	owned := lk.Context(ctx)
	c := startFaultContender(t, checker, "job", 10*time.Second, faultGrace, lk)
	defer c.halt()

	down := time.Now()
	x.Down()
	lost := faultWithin(lk.Done(), lease+2*time.Second)
	lostAfter := time.Since(down)

	const deadline = 200 * time.Millisecond
	took, lk2, err := faultLockWithin(holder, "other", deadline)
	if err == nil || lk2 != nil {
		t.Errorf("Lock while the network is down = %v, %v; want an error", lk2, err)
	}
	if took > deadline+time.Second {
		t.Errorf("Lock with a %v deadline returned after %v while the network was down", deadline, took)
	}
	const asks = 5
	var allowed int
	for range asks {
		d, err := g.Allow(ctx, "+100")
		if d.Allowed || !errors.Is(err, guard.ErrUnavailable) {
			allowed++
			t.Errorf("guard while the network is down: %+v, %v; want a denial with ErrUnavailable", d, err)
		}
	}
	// The contender takes the lock (for 10 s) once the lease has ended on
	// the server: wait for that, rather than a lease, on a loaded machine.
	faultUntil(func() bool { wins, _, _, _ := c.result(); return wins > 0 })
	wins, overlap, lag, _ := c.result()
	if !lost {
		t.Fatalf("holder did not report the loss %v into a network outage (lease %v)", lostAfter, lease)
	}
	if cause := context.Cause(owned); !errors.Is(cause, mutex.ErrLockLost) {
		t.Errorf("cause = %v, want ErrLockLost", cause)
	}
	if wins == 0 {
		t.Fatal("the contender never got the lock of the unreachable holder: its lease did not end")
	}
	c.halt()

	// The contender released each lock it took; take it again for the old
	// handle's Unlock to face.
	lk3, err := checker.TryLock(ctx, "job", mutex.WithTTL(10*time.Second))
	if err != nil {
		t.Fatalf("checker TryLock: %v", err)
	}
	x.Up(t)
	up := time.Now()
	downFor := up.Sub(down)
	if err := lk.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Errorf("old handle's Unlock after the outage = %v, want ErrNotHeld", err)
	}
	if ttl, err := lk3.TTL(ctx); err != nil || ttl <= 0 {
		t.Errorf("new holder's lock after the old handle's Unlock: TTL %v, %v", ttl, err)
	}
	if err := lk3.Unlock(ctx); err != nil {
		t.Error(err)
	}
	var firstLock, firstAllow time.Duration = -1, -1
	for try := 0; try < 200 && (firstLock < 0 || firstAllow < 0); try++ {
		if firstLock < 0 {
			tctx, cancel := context.WithTimeout(ctx, time.Second)
			if lk4, err := holder.TryLock(tctx, "job"); err == nil {
				firstLock = time.Since(up)
				_ = lk4.Unlock(ctx)
			}
			cancel()
		}
		if firstAllow < 0 {
			if d, err := g.Allow(ctx, "+100"); err == nil && d.Allowed {
				firstAllow = time.Since(up)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if firstLock < 0 || firstAllow < 0 {
		t.Fatalf("after the network came back: first lock %v, first admission %v (-1: none in 2 s)", firstLock, firstAllow)
	}
	fault := "network down " + downFor.Round(10*time.Millisecond).String() + ", lease " + lease.String()
	faultFigure(t, "auto-renew: loss reported after fault", fault, "%v", lostAfter.Round(time.Millisecond))
	faultFigure(t, "auto-renew: two holders seen by the checker", fault, "%d in %d contender acquisitions (max report lag %v)", overlap, wins, lag.Round(time.Millisecond))
	faultFigure(t, "Lock bounded by its ctx deadline "+deadline.String(), "network down (connection refused)", "returned after %v", took.Round(time.Millisecond))
	faultFigure(t, "guard FailClosed: admissions while down", fault, "%d of %d decisions", allowed, asks)
	faultFigure(t, "time to first acquire after recovery", fault+", then up", "%v", firstLock.Round(time.Millisecond))
	faultFigure(t, "time to first admission after recovery", fault+", then up", "%v", firstAllow.Round(time.Millisecond))
	faultNoOrphan(t, admin, lockKey, lease)
}
