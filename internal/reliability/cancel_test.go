package reliability

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// A cancelled call on a stopped server (issue 42). go-redis made with
// ContextTimeoutEnabled bounds a command by its context's deadline, not by a
// cancellation: it sets socket deadlines from ctx.Deadline and never
// watches ctx.Done. A call whose context is cancelled long before its
// deadline must still return at once, as an expired one does: each call
// here has a deadline 10 s away (go-redis's ReadTimeout, 3 s, is nearer), is
// cancelled once its command has gone to the stopped server, and must return
// within cancelBound of the cancellation.
//
// The bound is checked so that a loaded machine cannot fail it and a call
// that waits for the server cannot pass: every try must return within
// cancelLate (a call held by the server returns at go-redis's ReadTimeout,
// 5 s, or the deadline), and the median of cancelTries within cancelBound,
// each counted without the longest time a thread of this process waited
// for a CPU meanwhile (testutil.CPUWaits: on two busy cores a goroutine
// whose channel is ready can wait that long to run).

const (
	cancelTries    = 5
	cancelBound    = 20 * time.Millisecond
	cancelLate     = time.Second
	cancelDeadline = 10 * time.Second
)

// cancelSent signals each command that a client is about to send.
type cancelSent chan struct{}

func (s cancelSent) signal() {
	select {
	case s <- struct{}{}:
	default:
	}
}

func (s cancelSent) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s cancelSent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { s.signal(); return next(ctx, cmd) }
}

func (s cancelSent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { s.signal(); return next(ctx, cmds) }
}

// cancelOnce runs call with a context whose deadline is cancelDeadline
// away, cancels it once call has sent a command (and a little after, so
// that the command is on its way to the stopped server) and returns how long
// call took to return after the cancellation, with its error, and the
// longest a thread of this process waited for a CPU meanwhile.
func cancelOnce(t *testing.T, sent cancelSent, call func(ctx context.Context) error) (took, starved time.Duration, err error) {
	t.Helper()
	for len(sent) > 0 {
		<-sent
	}
	ctx, cancel := context.WithTimeout(context.Background(), cancelDeadline)
	defer cancel()
	type outcome struct {
		end time.Time
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		err := call(ctx)
		done <- outcome{time.Now(), err}
	}()
	select {
	case <-sent:
	case o := <-done:
		t.Fatalf("the call returned before it sent a command: %v", o.err)
	case <-time.After(faultHang):
		t.Fatalf("the call sent no command in %v", faultHang)
	}
	time.Sleep(2 * time.Millisecond)
	before := testutil.CPUWaits("self")
	at := time.Now()
	cancel()
	select {
	case o := <-done:
		return o.end.Sub(at), testutil.Starved(before, testutil.CPUWaits("self")), o.err
	case <-time.After(faultHang):
		t.Fatalf("the call has not returned %v after its cancellation", faultHang)
		return 0, 0, nil
	}
}

// cancelJudge checks the tries of one entry point, each took after its
// cancellation while a thread waited up to starved for a CPU, and records
// the figure.
func cancelJudge(t *testing.T, entry string, took, starved []time.Duration) {
	t.Helper()
	own := make([]time.Duration, len(took))
	for i, d := range took {
		if d > cancelLate {
			t.Errorf("%s, try %d: returned %v after its cancellation: it waited for the stopped server (deadline %v away)", entry, i, d.Round(time.Millisecond), cancelDeadline)
		}
		own[i] = max(d-starved[i], 0)
	}
	slices.Sort(own)
	if m := own[len(own)/2]; m > cancelBound {
		t.Errorf("%s: the median of %d tries returned %v after its cancellation, CPU waits taken off: over %v (took %v; CPU waits %v)", entry, len(own), m.Round(100*time.Microsecond), cancelBound, took, starved)
	}
	s := slices.Sorted(slices.Values(took))
	faultFigure(t, "cancelled call on a stopped server: "+entry+" returns after the cancellation", fmt.Sprintf("%s SIGSTOPped, ContextTimeoutEnabled, deadline %v away, %d tries", testutil.ServerName(), cancelDeadline, len(s)),
		"median %v, fastest %v, slowest %v (longest CPU wait of a thread in a try: %v)", s[len(s)/2].Round(100*time.Microsecond), s[0].Round(100*time.Microsecond), s[len(s)-1].Round(100*time.Microsecond), slices.Max(starved).Round(100*time.Microsecond))
}

// cancelServer starts a server of the test's own and a ContextTimeoutEnabled
// client of it that signals each command on the returned channel. Its pool
// has room for every call abandoned on the stopped server (each holds a
// connection until the ReadTimeout): a call that waited for a connection
// would leave at its cancellation in any case, and prove nothing.
func cancelServer(t *testing.T) (*testutil.Server, *redis.Client, cancelSent) {
	t.Helper()
	srv := testutil.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 128})
	t.Cleanup(func() { c.Close() })
	sent := make(cancelSent, 1)
	c.AddHook(sent)
	return srv, c, sent
}

// TestCancelledCallsReturnAtOnce: mutex Lock, Semaphore.TryAcquire, funnel
// Allow and guard Allow (FailClosed, Timeout 10 s), each on a name or key
// that worked while the server answered.
func TestCancelledCallsReturnAtOnce(t *testing.T) {
	srv, c, sent := cancelServer(t)
	ctx := hungSetup(t)
	prefix := testutil.NewPrefix()
	l := mustLocker(t, c, mutex.WithPrefix(prefix+"l:"))
	sem, err := l.Semaphore("sem", 1000)
	if err != nil {
		t.Fatal(err)
	}
	lim := mustLimiter(t, c, funnel.WithPrefix(prefix+"f:"))
	rule := funnel.Rule{Name: "roomy", Capacity: 1 << 40, Leak: 1 << 40, Per: time.Second}
	g, err := guard.New(c, guard.WithPrefix(prefix+"g:"), guard.WithRules(rule), guard.WithTimeout(cancelDeadline))
	if err != nil {
		t.Fatal(err)
	}
	// Every entry point works, its scripts are cached, its keys have state.
	lk, err := l.Lock(ctx, "warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := sem.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if res, err := lim.Allow(ctx, "key", rule); err != nil || !res.Allowed {
			t.Fatalf("funnel Allow before the stop: %+v, %v", res, err)
		}
		if d, err := g.Allow(ctx, "+15550100"); err != nil || !d.Allowed {
			t.Fatalf("guard Allow before the stop: %+v, %v", d, err)
		}
	}

	testutil.Freeze(t, srv.Pid())

	entries := []struct {
		name string
		call func(ctx context.Context, i int) error
	}{
		{"mutex Lock", func(ctx context.Context, i int) error {
			_, err := l.Lock(ctx, fmt.Sprint("lock", i))
			return err
		}},
		// A Locker of its own each time: an abandoned acquisition's give-back
		// holds one of its Locker's 4 slots (send.go) on the stopped server
		// for up to 2 s, and the fifth call would wait in its queue, sending
		// nothing to the server.
		{"mutex Semaphore.TryAcquire", func(ctx context.Context, _ int) error {
			s, err := mustLocker(t, c, mutex.WithPrefix(prefix+"l:")).Semaphore("sem", 1000)
			if err != nil {
				return err
			}
			_, err = s.TryAcquire(ctx, 1)
			return err
		}},
		{"funnel Allow", func(ctx context.Context, _ int) error {
			_, err := lim.Allow(ctx, "key", rule)
			return err
		}},
		{"guard Allow (FailClosed)", func(ctx context.Context, _ int) error {
			_, err := g.Allow(ctx, "+15550100")
			return err
		}},
	}
	for _, e := range entries {
		t.Run(e.name, func(t *testing.T) {
			var took, starved []time.Duration
			for i := range cancelTries {
				d, w, err := cancelOnce(t, sent, func(ctx context.Context) error { return e.call(ctx, i) })
				if !errors.Is(err, context.Canceled) {
					t.Errorf("try %d: %v; want an error matching context.Canceled", i, err)
				}
				took, starved = append(took, d), append(starved, w)
			}
			cancelJudge(t, e.name, took, starved)
		})
	}
}

// A lock that a cancelled attempt took once the server continued is
// released by the attempt's late reply (the hand-off's late function, as on
// a client that ignores deadlines), not left for its lease (10 s) to a
// Locker that never tries the name again: TryLock by the acquire script (a
// Locker that has run no script yet) and by a native SET NX.
func TestCancelledAttemptIsUndone(t *testing.T) {
	srv, c, sent := cancelServer(t)
	ctx := hungSetup(t)
	prefix := testutil.NewPrefix()
	warm := mustLocker(t, c, mutex.WithPrefix(prefix), mutex.WithTTL(cancelLease))
	faultWarm(t, warm, prefix) // the scripts are cached, for the Locker below too
	script := mustLocker(t, c, mutex.WithPrefix(prefix), mutex.WithTTL(cancelLease))
	other := srv.Client(t)

	thaw := testutil.Freeze(t, srv.Pid())
	for _, a := range []struct {
		via  string
		l    *mutex.Locker
		name string
	}{{"the acquire script", script, "script"}, {"SET NX", warm, "setnx"}} {
		d, _, err := cancelOnce(t, sent, func(ctx context.Context) error {
			_, err := a.l.TryLock(ctx, a.name)
			return err
		})
		if !errors.Is(err, context.Canceled) || d > cancelLate {
			t.Fatalf("TryLock by %s cancelled on a stopped server: %v after %v; want context.Canceled at once", a.via, err, d)
		}
	}
	thaw() // within the ReadTimeout: the attempts' replies come, to their late functions
	thawed := time.Now()
	for _, name := range []string{"script", "setnx"} {
		_, _, key := faultKeys(prefix, name)
		for other.Exists(ctx, key).Val() != 0 {
			if time.Since(thawed) > cancelUndone {
				t.Errorf("the lock %q that a cancelled TryLock took after SIGCONT is still held %v later (lease %v): its late reply was not undone", name, cancelUndone, cancelLease)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// cancelLease is the lease of TestCancelledAttemptIsUndone's locks, and
// cancelUndone the time their release may take after SIGCONT: the late
// reply, then a release once a PING is answered (bounded by 2 s).
const (
	cancelLease  = time.Minute
	cancelUndone = 5 * time.Second
)
