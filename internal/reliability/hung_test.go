package reliability

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// A hung server: redis-server stopped with SIGSTOP. Its port still accepts
// connections (the kernel completes the handshake) and takes the commands,
// but nothing answers: no reset, no refused connection, only silence, which
// is what a swapping host or a frozen VM looks like to a client. Every public
// call that talks to Redis must return by its context's deadline plus a small
// margin whatever the client's options: on go-redis's defaults, which bound
// socket I/O by their own timeouts only (5 s a try with v9.23, measured) and
// retry, as on a client made with ContextTimeoutEnabled. Each case takes what it needs while the server
// answers (a held lock, a funnel with state), then stops the server and
// times one call per entry point.

const (
	// hungDeadline is the ctx deadline of each call (a guard's
	// WithTimeout, with a background ctx).
	hungDeadline = 300 * time.Millisecond
	// hungMargin is the requirement's "small margin": what a call may take
	// past its deadline to notice it and return.
	hungMargin = 100 * time.Millisecond
)

// hungClients are the two clients every case runs on.
var hungClients = []struct {
	name string
	opts func(addr string) *redis.Options
}{
	// go-redis's defaults: a ctx deadline does not bound socket I/O, so the
	// libraries run each call in a goroutine and leave at the deadline.
	{"default-client", func(addr string) *redis.Options { return &redis.Options{Addr: addr} }},
	// The client the design asks for: go-redis bounds I/O by the deadline.
	{"ctx-deadlines", func(addr string) *redis.Options {
		return &redis.Options{Addr: addr, ContextTimeoutEnabled: true}
	}},
}

// hungServer starts a redis-server of the test's own and a client of it with
// opts, closed when t ends (after the server is continued: the cleanups run
// in reverse, and Freeze comes later).
func hungServer(t *testing.T, opts func(addr string) *redis.Options) (*testutil.Server, *redis.Client) {
	t.Helper()
	srv := testutil.StartServer(t)
	c := redis.NewClient(opts(srv.Addr))
	t.Cleanup(func() { c.Close() })
	return srv, c
}

// hungSetup is a ctx for the work done while the server answers: a bound on
// a hang, not a measurement.
func hungSetup(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), faultHang)
	t.Cleanup(cancel)
	return ctx
}

// hungTime runs call in a goroutine and returns how long it took (measured
// around the call itself), its error, and the longest time a thread of this
// process waited for a CPU meanwhile (see testutil.CPUWaits). A call that returns
// late by about that much was late because the process did not run (a
// loaded machine), not because it waited for Redis. If the call has not
// returned after faultHang, t fails there with every goroutine's stack: it
// hangs with the server, and the test says where instead of waiting for go
// test's timeout.
func hungTime(t *testing.T, call func() error) (took, starved time.Duration, err error) {
	t.Helper()
	type outcome struct {
		took time.Duration
		err  error
	}
	done := make(chan outcome, 1)
	before := testutil.CPUWaits("self")
	go func() {
		start := time.Now()
		err := call()
		done <- outcome{time.Since(start), err}
	}()
	select {
	case o := <-done:
		return o.took, testutil.Starved(before, testutil.CPUWaits("self")), o.err
	case <-time.After(faultHang):
		buf := make([]byte, 1<<20)
		t.Fatalf("the call has not returned %v after it began (deadline %v): it hangs with the server\n%s",
			faultHang, hungDeadline, buf[:runtime.Stack(buf, true)])
		return 0, 0, nil
	}
}

// hungJudge fails t if a call that took took on the hung server returned
// later than its deadline plus hungMargin, and records the figure with the
// longest wait of a thread of this process for a CPU meanwhile. That wait
// is not the call's: on a loaded machine (two busy processes on two cores)
// the caller's timer fires on time but its goroutine waits for a CPU, so
// the bound is checked on the time the process had the CPUs it asked for.
// A call that blocks on the server (go-redis's 5 s ReadTimeout) fails it
// whatever the load.
func hungJudge(t *testing.T, kind, entry string, took, starved time.Duration) {
	t.Helper()
	if took-starved > hungDeadline+hungMargin {
		t.Errorf("%s took %v on a hung server: over its deadline %v + %v (a thread of this process waited up to %v for a CPU meanwhile)",
			entry, took, hungDeadline, hungMargin, starved)
	}
	faultFigure(t, "hung server: "+entry+" returns after", hungFault(kind),
		"%v (%v past the deadline; a thread waited up to %v for a CPU)", hungRound(took), hungRound(took-hungDeadline), hungRound(starved))
}

func hungRound(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }

func hungFault(kind string) string {
	return fmt.Sprintf("%s SIGSTOPped, %s, deadline %v, bound +%v", testutil.ServerName(), kind, hungDeadline, hungMargin)
}

// hungCall runs call as the subtest entry with a ctx whose deadline is
// hungDeadline, checks that it returned within the bound with an error
// (and, if check is set, the error check accepts), and records the figure.
func hungCall(t *testing.T, kind, entry string, call func(ctx context.Context) error, check func(error) string) {
	t.Helper()
	t.Run(entry, func(t *testing.T) {
		took, starved, err := hungTime(t, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), hungDeadline)
			defer cancel()
			return call(ctx)
		})
		hungJudge(t, kind, entry, took, starved)
		switch {
		case err == nil:
			t.Errorf("%s returned no error on a hung server (after %v)", entry, took)
		case check != nil:
			if why := check(err); why != "" {
				t.Errorf("%s: %v: %s", entry, err, why)
			}
		}
		t.Logf("%s: %v after %v", entry, err, took)
	})
}

// stillHeld checks the error of a call on a lock that is still held in
// Redis (its lease is long): the outcome is unknown, so the error must not
// claim the lock is gone.
func stillHeld(err error) string {
	if errors.Is(err, mutex.ErrNotHeld) {
		return "ErrNotHeld for a lock whose lease has not ended: the server never answered"
	}
	return ""
}

// TestHungMutex: Lock (of a free name and of a name another client holds),
// TryLock, and, on locks taken before the server stopped, Unlock, Extend,
// TTL, Run and UnlockWith.
func TestHungMutex(t *testing.T) {
	for _, kind := range hungClients {
		t.Run(kind.name, func(t *testing.T) {
			srv, c := hungServer(t, kind.opts)
			ctx := hungSetup(t)
			prefix := testutil.NewPrefix()
			l := mustLocker(t, c, mutex.WithPrefix(prefix))
			faultWarm(t, l, prefix)
			// The contended name is held by another client (another
			// process): a Locker would queue its own goroutines behind
			// a local holder without asking Redis.
			other := mustLocker(t, srv.Client(t), mutex.WithPrefix(prefix))
			if _, err := other.Lock(ctx, "held"); err != nil {
				t.Fatal(err)
			}
			mine := map[string]*mutex.Lock{}
			for _, name := range []string{"unlock", "extend", "ttl", "run", "unlockwith"} {
				lk, err := l.Lock(ctx, name) // the Locker's lease, 10 s: held all through the test
				if err != nil {
					t.Fatal(err)
				}
				mine[name] = lk
			}
			counter, log, _ := faultKeys(prefix, "unlockwith")
			read := mutex.NewFragment(`return redis.call('GET', KEYS[1])`)

			testutil.Freeze(t, srv.Pid())

			notObtained := func(err error) string {
				if !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
					return "want an error matching ErrNotObtained and context.DeadlineExceeded"
				}
				return ""
			}
			hungCall(t, kind.name, "mutex Lock (free name)", func(ctx context.Context) error {
				_, err := l.Lock(ctx, "free")
				return err
			}, notObtained)
			hungCall(t, kind.name, "mutex Lock, 24 overlapping calls (queued and pipelined)", func(ctx context.Context) error {
				errs := make([]error, 24)
				var wg sync.WaitGroup
				for i := range errs {
					wg.Go(func() { _, errs[i] = l.Lock(ctx, "overlap"+strconv.Itoa(i)) })
				}
				wg.Wait()
				for _, err := range errs {
					if why := notObtained(err); why != "" {
						return fmt.Errorf("one of the calls: %w (%s)", err, why)
					}
				}
				return errs[0]
			}, notObtained)
			hungCall(t, kind.name, "mutex Lock (held by another client)", func(ctx context.Context) error {
				_, err := l.Lock(ctx, "held")
				return err
			}, notObtained)
			hungCall(t, kind.name, "mutex TryLock", func(ctx context.Context) error {
				_, err := l.TryLock(ctx, "held")
				return err
			}, func(err error) string {
				if errors.Is(err, mutex.ErrLocked) {
					return "ErrLocked: the server never answered"
				}
				return ""
			})
			hungCall(t, kind.name, "mutex Unlock", func(ctx context.Context) error {
				return mine["unlock"].Unlock(ctx)
			}, stillHeld)
			hungCall(t, kind.name, "mutex Extend", func(ctx context.Context) error {
				return mine["extend"].Extend(ctx, 10*time.Second)
			}, stillHeld)
			hungCall(t, kind.name, "mutex Lock.TTL", func(ctx context.Context) error {
				_, err := mine["ttl"].TTL(ctx)
				return err
			}, stillHeld)
			hungCall(t, kind.name, "mutex Lock.Run", func(ctx context.Context) error {
				_, err := mine["run"].Run(ctx, mutex.Call{Fragment: read, Keys: []string{mustKey(t, l, "run", "n")}})
				return err
			}, stillHeld)
			hungCall(t, kind.name, "mutex UnlockWith", func(ctx context.Context) error {
				_, err := mine["unlockwith"].UnlockWith(ctx, mutex.Call{Fragment: faultCommit, Keys: []string{counter, log}, Args: []any{1, "hung"}})
				return err
			}, stillHeld)
		})
	}
}

// TestHungFunnel: Allow, Peek, Refund and Reset of a key that has state.
func TestHungFunnel(t *testing.T) {
	rule := funnel.Rule{Name: "hour", Capacity: 5, Leak: 1, Per: time.Hour}
	for _, kind := range hungClients {
		t.Run(kind.name, func(t *testing.T) {
			srv, c := hungServer(t, kind.opts)
			ctx := hungSetup(t)
			lim := mustLimiter(t, c, funnel.WithPrefix(testutil.NewPrefix()))
			// Two admissions and a refund: the scripts are cached, the
			// key has state, and every call works while the server answers.
			for range 2 {
				if res, err := lim.Allow(ctx, "sms", rule); err != nil || !res.Allowed {
					t.Fatalf("Allow before the stop: %+v, %v", res, err)
				}
			}
			if err := lim.Refund(ctx, "sms", 1, rule); err != nil {
				t.Fatal(err)
			}
			if res, err := lim.Peek(ctx, "sms", rule); err != nil || res.Remaining != rule.Capacity-1 {
				t.Fatalf("Peek before the stop: %+v, %v; want %d remaining", res, err, rule.Capacity-1)
			}

			testutil.Freeze(t, srv.Pid())

			hungCall(t, kind.name, "funnel Allow", func(ctx context.Context) error {
				_, err := lim.Allow(ctx, "sms", rule)
				return err
			}, nil)
			hungCall(t, kind.name, "funnel Peek", func(ctx context.Context) error {
				_, err := lim.Peek(ctx, "sms", rule)
				return err
			}, nil)
			hungCall(t, kind.name, "funnel Refund", func(ctx context.Context) error {
				return lim.Refund(ctx, "sms", 1, rule)
			}, nil)
			hungCall(t, kind.name, "funnel Reset", func(ctx context.Context) error {
				return lim.Reset(ctx, "sms")
			}, nil)
			// Again, on a key the abandoned calls above did not touch.
			hungCall(t, kind.name, "funnel Allow (another key)", func(ctx context.Context) error {
				_, err := lim.Allow(ctx, "other", rule)
				return err
			}, nil)
		})
	}
}

// TestHungGuard: Allow failing closed (a denial, Degraded, ErrUnavailable),
// Peek and Refund; and Allow failing open, 20 times on one key: each call
// within the Timeout + hungMargin, Degraded with ErrUnavailable, and at
// most the rule's 2 admitted (the rules decided in this process).
func TestHungGuard(t *testing.T) {
	rules := []funnel.Rule{funnel.AtMost(2, time.Hour)}
	unavailable := func(err error) string {
		if !errors.Is(err, guard.ErrUnavailable) {
			return "want an error matching guard.ErrUnavailable"
		}
		return ""
	}
	for _, kind := range hungClients {
		t.Run(kind.name, func(t *testing.T) {
			srv, c := hungServer(t, kind.opts)
			prefix := testutil.NewPrefix()
			closed, err := guard.New(c, guard.WithPrefix(prefix+"closed:"), guard.WithRules(rules...), guard.WithTimeout(hungDeadline), guard.WithOnError(guard.FailClosed))
			if err != nil {
				t.Fatal(err)
			}
			open, err := guard.New(c, guard.WithPrefix(prefix+"open:"), guard.WithRules(rules...), guard.WithTimeout(hungDeadline), guard.WithOnError(guard.FailOpen))
			if err != nil {
				t.Fatal(err)
			}
			// One admission each while the server answers: the key has
			// state, and the guards work.
			for _, g := range []*guard.Guard{closed, open} {
				if d, err := g.Allow(context.Background(), "+447700900123"); err != nil || !d.Allowed || d.Degraded {
					t.Fatalf("Allow before the stop: %+v, %v", d, err)
				}
			}

			testutil.Freeze(t, srv.Pid())

			t.Run("FailClosed Allow", func(t *testing.T) {
				var d guard.Decision
				took, starved, err := hungTime(t, func() (err error) {
					d, err = closed.Allow(context.Background(), "+447700900123")
					return err
				})
				hungJudge(t, kind.name, "guard Allow (FailClosed)", took, starved)
				if d.Allowed || !d.Degraded || !errors.Is(err, guard.ErrUnavailable) || d.RetryAfter <= 0 {
					t.Errorf("FailClosed on a hung server: %+v, %v; want a degraded denial with a RetryAfter and ErrUnavailable", d, err)
				}
				t.Logf("%+v, %v after %v", d, err, took)
			})
			// A guard's calls take WithTimeout, not ctx: a background
			// ctx here (hungCall's deadline is the same and does not bind).
			hungCall(t, kind.name, "guard Peek (FailClosed)", func(context.Context) error {
				d, err := closed.Peek(context.Background(), "+447700900123")
				if err != nil && (d.Allowed || !d.Degraded) {
					return fmt.Errorf("decision %+v with %w", d, err)
				}
				return err
			}, unavailable)
			hungCall(t, kind.name, "guard Refund (FailClosed)", func(context.Context) error {
				return closed.Refund(context.Background(), "+447700900123")
			}, unavailable)

			t.Run("FailOpen Allow x20", func(t *testing.T) {
				const calls = 20
				admitted := 0
				var slowest, slowestStarved, total time.Duration
				for i := range calls {
					var d guard.Decision
					took, starved, err := hungTime(t, func() (err error) {
						d, err = open.Allow(context.Background(), "+447700900123")
						return err
					})
					if took > slowest {
						slowest, slowestStarved = took, starved
					}
					total += took
					if took-starved > hungDeadline+hungMargin { // as hungJudge: the time the process had the CPUs it asked for
						t.Errorf("call %d took %v: over WithTimeout %v + %v (a thread of this process waited up to %v for a CPU meanwhile)",
							i, took, hungDeadline, hungMargin, starved)
					}
					if !d.Degraded || !errors.Is(err, guard.ErrUnavailable) {
						t.Errorf("call %d: %+v, %v; want Degraded and ErrUnavailable", i, d, err)
					}
					if d.Allowed {
						admitted++
					}
					t.Logf("call %d: allowed %v degraded %v retry-after %v after %v (a thread waited up to %v for a CPU)", i, d.Allowed, d.Degraded, d.RetryAfter, took, starved)
				}
				if admitted > 2 {
					t.Errorf("FailOpen admitted %d of %d calls on one key under AtMost(2, 1h) while Redis hung: unbounded", admitted, calls)
				}
				if admitted == 0 {
					t.Errorf("FailOpen admitted none of %d calls on a key with room: it failed closed", calls)
				}
				faultFigure(t, "hung server: guard Allow (FailOpen) returns after, slowest of 20", hungFault(kind.name),
					"%v (%v past the deadline; a thread waited up to %v for a CPU; mean %v)", hungRound(slowest), hungRound(slowest-hungDeadline), hungRound(slowestStarved), hungRound(total/calls))
				faultFigure(t, "hung server: guard FailOpen admissions, 20 calls on one key, AtMost(2, 1h)", hungFault(kind.name),
					"%d admitted", admitted)
			})
		})
	}
}

// TestHungGuardInFlight: Do with WithInFlight, the server stopped inside
// fn (after the admission and the permit): Do returns within the Timeout
// + hungMargin of fn's end, with fn's own result (the permit's release, on
// the hung server, cannot make it wait or fail), and fn ran once. Then a Do
// with the server still stopped: refused with ErrUnavailable in the same
// time, fn not run.
func TestHungGuardInFlight(t *testing.T) {
	for _, kind := range hungClients {
		t.Run(kind.name, func(t *testing.T) {
			srv, c := hungServer(t, kind.opts)
			g, err := guard.New(c, guard.WithPrefix(testutil.NewPrefix()), guard.WithRules(funnel.AtMost(100, time.Hour)), guard.WithTimeout(hungDeadline), guard.WithInFlight(2))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := g.Do(context.Background(), "+447700900123", func(context.Context) error { return nil }); err != nil {
				t.Fatalf("Do before the stop: %v", err)
			}
			ran := 0
			var fnEnd time.Time
			var d guard.Decision
			_, starved, err := hungTime(t, func() (err error) {
				d, err = g.Do(context.Background(), "+447700900123", func(context.Context) error {
					ran++
					testutil.Freeze(t, srv.Pid())
					fnEnd = time.Now()
					return nil
				})
				return err
			})
			after := time.Since(fnEnd)
			if ran != 1 || err != nil || !d.Allowed {
				t.Fatalf("Do with the server stopped in fn: ran %d, %+v, %v; want fn run once and its nil", ran, d, err)
			}
			// hungTime returned: after is measured past Do's return.
			hungJudge(t, kind.name, "guard Do (InFlight), stopped in fn, after fn", after, starved)
			took, starved, err := hungTime(t, func() error {
				_, err := g.Do(context.Background(), "+447700900123", func(context.Context) error { ran++; return nil })
				return err
			})
			hungJudge(t, kind.name, "guard Do (InFlight)", took, starved)
			if ran != 1 || !errors.Is(err, guard.ErrUnavailable) {
				t.Errorf("Do on a hung server: fn ran %d times in all, %v; want it not run and ErrUnavailable", ran, err)
			}
		})
	}
}

// TestHungSemaphore: TryAcquire, Acquire (queued behind a holder of another
// client, so that it listens on Pub/Sub) and, on a permit taken before the
// server stopped, Extend and Release.
func TestHungSemaphore(t *testing.T) {
	for _, kind := range hungClients {
		t.Run(kind.name, func(t *testing.T) {
			srv, c := hungServer(t, kind.opts)
			ctx := hungSetup(t)
			prefix := testutil.NewPrefix()
			l := mustLocker(t, c, mutex.WithPrefix(prefix))
			faultWarm(t, l, prefix)
			sem := func(l *mutex.Locker, name string) *mutex.Semaphore {
				s, err := l.Semaphore(name, 1)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			other := mustLocker(t, srv.Client(t), mutex.WithPrefix(prefix))
			if _, err := sem(other, "full").TryAcquire(ctx, 1); err != nil {
				t.Fatal(err)
			}
			mine := map[string]*mutex.Permit{}
			for _, name := range []string{"extend", "release"} {
				p, err := sem(l, name).TryAcquire(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				mine[name] = p
			}

			testutil.Freeze(t, srv.Pid())

			hungCall(t, kind.name, "mutex Semaphore.TryAcquire", func(ctx context.Context) error {
				_, err := sem(l, "free").TryAcquire(ctx, 1)
				return err
			}, nil)
			hungCall(t, kind.name, "mutex Semaphore.Acquire (queued)", func(ctx context.Context) error {
				_, err := sem(l, "full").Acquire(ctx, 1)
				return err
			}, nil)
			hungCall(t, kind.name, "mutex Permit.Extend", func(ctx context.Context) error {
				return mine["extend"].Extend(ctx, 10*time.Second)
			}, nil)
			hungCall(t, kind.name, "mutex Permit.Release", func(ctx context.Context) error {
				return mine["release"].Release(ctx)
			}, nil)
		})
	}
}
