package funnel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// A call that failed is not charged: an admission answered with an error
// because Redis was stopped (SIGSTOP) past the call's deadline takes
// nothing, though its commands wait in the server's socket and run when it
// is continued. Each path is tried testutil.Tries times (100 by default);
// the state is read after the server ran what it was sent while stopped
// (the check's command goes after them).

// bigRule has room for every try's units, and gives one back every 1000 h:
// Remaining moves only by what the calls take.
var bigRule = funnel.Rule{Name: "big", Capacity: 1000, Leak: 1, Per: 1000 * time.Hour}

// pausedRig is a Limiter on a server of its own, which the test stops.
type pausedRig struct {
	lim    *funnel.Limiter
	client *redis.Client // the Limiter's
	stop   *testutil.Stopper
}

// newPausedRig starts a server and a Limiter on it with opts, whose client
// honours deadlines (ContextTimeoutEnabled) or leaves them to the Limiter,
// and makes one call with a deadline first: the scripts are loaded, a
// connection is open, and the Limiter has a sample of the server's clock.
func newPausedRig(t *testing.T, honours bool, opts ...funnel.Option) *pausedRig {
	t.Helper()
	return newHookedRig(t, honours, nil, opts...)
}

// newHookedRig is newPausedRig with hook, if not nil, on the client.
func newHookedRig(t *testing.T, honours bool, hook redis.Hook, opts ...funnel.Option) *pausedRig {
	t.Helper()
	srv := testutil.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: honours})
	t.Cleanup(func() { _ = c.Close() })
	if hook != nil {
		c.AddHook(hook)
	}
	rig := &pausedRig{lim: mustLimiter(t, c, opts...), client: c, stop: testutil.NewStopper(t, srv.Pid())}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 2 { // a key with no state, then one with state: every script
		if _, err := rig.lim.Allow(ctx, "warm-up", funnel.AtMost(2, time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	return rig
}

// remaining is Peek's Remaining for key under bigRule.
func (rig *pausedRig) remaining(t *testing.T, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := rig.lim.Peek(ctx, key, bigRule)
	if err != nil {
		t.Fatalf("Peek(%q) after the server was continued: %v", key, err)
	}
	return res.Remaining
}

// take admits n units of key, so that it has state.
func (rig *pausedRig) take(t *testing.T, key string, n int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if res, err := rig.lim.AllowN(ctx, key, n, bigRule); err != nil || !res.Allowed {
		t.Fatalf("AllowN(%q, %d) = %+v, %v", key, n, res, err)
	}
}

// stopped runs AllowN(key, n) with a deadline timeout away while the server
// is stopped, continues it, and returns the call's error.
func (rig *pausedRig) stopped(t *testing.T, key string, n int64, timeout time.Duration) error {
	t.Helper()
	if err := rig.stop.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := rig.lim.AllowN(ctx, key, n, bigRule)
	rig.stop.Cont()
	if err == nil {
		t.Fatalf("AllowN(%q, %d) on a stopped server = %+v; want an error", key, n, res)
	}
	return err
}

// reportCharged fails t when any of tries failed calls was charged.
func reportCharged(t *testing.T, charged, tries int) {
	t.Helper()
	t.Logf("FIGURE failed calls charged | %s | %d of %d", t.Name(), charged, tries)
	if charged > 0 {
		t.Errorf("%d of %d calls answered with an error were charged; want 0", charged, tries)
	}
}

// The first call of a key (admitted in one round trip by admit.lua, with
// no lock) while the server is stopped: its script runs when the server is
// continued, after the caller's deadline, and writes nothing.
func TestFailedCallNotChargedFirstCall(t *testing.T) {
	for _, honours := range []bool{true, false} {
		for _, n := range []int64{1, 3} {
			t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v/n=%d", honours, n), func(t *testing.T) {
				rig := newPausedRig(t, honours)
				tries, charged := testutil.Tries(t), 0
				for i := range tries {
					key := fmt.Sprintf("first-%d", i)
					if err := rig.stopped(t, key, n, 20*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("try %d: %v; want a deadline error", i, err)
					}
					if rig.remaining(t, key) != bigRule.Capacity {
						charged++
					}
				}
				reportCharged(t, charged, tries)
			})
		}
	}
}

// A key with state while the server is stopped: the gate (admit.lua) runs
// after the deadline, writes nothing and takes no lock (an abandoned lock
// attempt would hold the key for its lease).
func TestFailedCallNotChargedKeyWithState(t *testing.T) {
	rig := newPausedRig(t, true)
	rig.take(t, "k", 1)
	lock := rig.lim.Locker().LockKey("k")
	tries, charged, locked := testutil.Tries(t), 0, 0
	for range tries {
		before := rig.remaining(t, "k")
		rig.stopped(t, "k", 2, 20*time.Millisecond)
		if rig.remaining(t, "k") != before {
			charged++
		}
		if rig.client.Exists(context.Background(), lock).Val() != 0 {
			locked++
			rig.client.Del(context.Background(), lock) // the next try starts free
		}
	}
	t.Logf("FIGURE locks left by failed calls | %s | %d of %d", t.Name(), locked, tries)
	if locked > 0 {
		t.Errorf("%d of %d failed calls left the key locked; want 0", locked, tries)
	}
	reportCharged(t, charged, tries)
}

// The server stopped between an admission's read and its commit (the lock
// held, the commit sent): the commit's write runs when the server is
// continued, inside the lock's lease, after the caller's deadline, and is
// refused. Without the state cache, whose gate would admit the returning
// key in one round trip, with no commit to stop (every try passed so, and
// tested nothing).
func TestFailedCallNotChargedCommitStopped(t *testing.T) {
	for _, n := range []int64{1, 3} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			// Once armed, the server is stopped as the commit is sent.
			var armed atomic.Bool
			var stops atomic.Int64
			var rig *pausedRig
			rig = newHookedRig(t, true, &scriptHook{sha: funnel.WriteBackSHA, before: func(redis.Cmder) {
				if armed.CompareAndSwap(true, false) {
					stops.Add(1)
					_ = rig.stop.Stop() // a failed stop shows as an admitted call
				}
			}}, funnel.WithStateCache(0))
			rig.take(t, "k", 1)
			tries, charged := testutil.Tries(t), 0
			defer func() {
				t.Logf("FIGURE commits stopped | %s | %d of %d tries", t.Name(), stops.Load(), tries)
				if stops.Load() == 0 {
					t.Error("no commit was stopped: the test did not test it")
				}
			}()
			for i := range tries {
				before := rig.remaining(t, "k")
				armed.Store(true)
				ctx, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
				res, err := rig.lim.AllowN(ctx, "k", n, bigRule)
				cancel()
				rig.stop.Cont()
				after := rig.remaining(t, "k")
				switch {
				case err == nil && res.Allowed && after == before-n:
					// The read came after the deadline on a loaded machine:
					// no commit was stopped. Rare; the try counts as one.
				case err == nil:
					t.Fatalf("try %d: AllowN = %+v; want an error or an admission", i, res)
				case after != before:
					charged++
				}
			}
			reportCharged(t, charged, tries)
		})
	}
}

// A batch (batchCalls calls of one key sharing a lock hold, with different
// deadlines) whose commit is sent while the server is stopped: the write
// carries every admitted call's units and is refused from the earliest of
// their deadlines. The server is continued after every call returned, or
// after the first did: then the others may still be admitted, by a write
// that carries only theirs. Every call answered with an error took nothing.
func TestFailedCallNotChargedBatch(t *testing.T) {
	for _, wait := range []int{batchCalls, 1} {
		t.Run(fmt.Sprintf("continued after %d returned", wait), func(t *testing.T) {
			// Without the state cache, whose gate would admit the
			// leader alone and make the others commit in a later batch.
			// Once armed, the server is stopped as the commit is sent; first
			// keeps the commit's bound: the server time (µs) from which its
			// write is refused, the earliest deadline of the calls it
			// writes for (write.lua's ARGV[2]; 0: none).
			var armed atomic.Bool
			var first atomic.Int64
			var rig *pausedRig
			rig = newHookedRig(t, true, &scriptHook{sha: funnel.WriteBackSHA, before: func(cmd redis.Cmder) {
				if armed.CompareAndSwap(true, false) {
					if d, ok := scriptArg(cmd, 1); ok {
						first.Store(d)
					}
					_ = rig.stop.Stop()
				}
			}}, funnel.WithStateCache(0))
			rig.take(t, "k", 1)
			tries, charged, batched := testutil.Tries(t), 0, 0
			var admittedAll int64
			for range tries {
				before := rig.remaining(t, "k")
				first.Store(0)
				admitted, full := rig.stoppedBatch(t, &armed, &first, wait)
				if full {
					batched++
				}
				admittedAll += admitted
				if rig.remaining(t, "k") != before-admitted {
					charged++
				}
			}
			t.Logf("FIGURE batches of %d calls | %s | %d of %d tries; %d calls admitted", batchCalls, t.Name(), batched, tries, admittedAll)
			reportCharged(t, charged, tries)
		})
	}
}

// batchCalls is the number of calls in TestFailedCallNotChargedBatch's
// batches.
const batchCalls = 4

// stoppedBatch runs batchCalls calls of one unit on "k" with deadlines 50
// ms away and more (spread), stopping the server until the others joined the first
// one's batch (or 50 ms passed), and again at the first commit (armed),
// until wait calls returned and the earliest deadline of the calls that
// commit writes for (first, its bound in the server's time, which is this
// machine's clock, set by the hook) has passed: a call that
// returned may have left before the decision (a loaded machine), and a
// commit then run while all its calls still had time is written, and its
// reply may come after one's deadline (a write that ran in time, whose
// reply came late: not covered, see doc.go). It returns how many calls were
// admitted, and whether all of them joined one batch.
func (rig *pausedRig) stoppedBatch(t *testing.T, armed *atomic.Bool, first *atomic.Int64, wait int) (int64, bool) {
	t.Helper()
	watch := newBatchWatch()
	if err := rig.stop.Stop(); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	// The deadlines 10 ms apart when every call returns before the commit
	// runs; 100 ms apart when the others are decided again after the
	// refused commit: their commit runs in time, and a reply that comes late
	// (a starved process) would charge a call answered with an error, the
	// exception doc.go states (CI under load: 1 of 100 tries with 10 ms).
	spread := 10 * time.Millisecond
	if wait < batchCalls {
		spread = 100 * time.Millisecond
	}
	var wg sync.WaitGroup
	var admitted atomic.Int64
	returned := make(chan struct{}, batchCalls)
	for j := range batchCalls {
		wg.Go(func() {
			defer func() { returned <- struct{}{} }()
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond+time.Duration(j)*spread)
			defer cancel()
			if res, err := rig.lim.Allow(ctx, "k", bigRule); err == nil && res.Allowed {
				admitted.Add(1)
			}
		})
	}
	full := watch.waiting(batchCalls-1, 50*time.Millisecond) == batchCalls-1
	rig.stop.Cont() // the gate runs; the commit stops the server again
	awaitSome(returned, wait, time.Minute)
	if d := first.Load(); d != 0 {
		time.Sleep(time.Until(time.UnixMicro(d)))
	}
	rig.stop.Cont()
	wg.Wait()
	// On a loaded machine the commit may come after that Cont (the calls
	// that returned first ran out of time before the gate did): it stopped
	// the server again, and only the calls' deadlines ended them. Every
	// call has returned, so no commit is under way: disarm, then continue.
	armed.Store(false)
	rig.stop.Cont()
	return admitted.Load(), full
}

// awaitSome waits up to d for n values from c, and returns how many came.
func awaitSome(c chan struct{}, n int, d time.Duration) int {
	timeout := time.After(d)
	for i := range n {
		select {
		case <-c:
		case <-timeout:
			return i
		}
	}
	return n
}

// A server clock that steps forward (miniredis's SetTime) past the bound of
// a write refuses that write, not the call: the call has time left, so it
// is decided again on a fresh read, whose clock bounds the next write, and
// is admitted once. On a first call (admit.lua, bounded by the Limiter's
// last sample) and on a commit (bounded by its own read; without the state
// cache, which would admit the returning key in its gate: see
// TestReturningClockStep).
func TestFailedCallClockStep(t *testing.T) {
	b := testutil.Mini(t)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	b.Mini.SetTime(t0)
	var armed atomic.Bool
	steps := &scriptHook{sha: funnel.WriteBackSHA, before: func(redis.Cmder) {
		if armed.CompareAndSwap(true, false) {
			b.Mini.SetTime(t0.Add(48 * time.Hour))
		}
	}}
	client := b.Client(t)
	client.AddHook(steps)
	lim := mustLimiter(t, client, funnel.WithPrefix(b.Prefix), funnel.WithStateCache(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := lim.Allow(ctx, "warm-up", bigRule); err != nil { // a sample at t0
		t.Fatal(err)
	}
	b.Mini.SetTime(t0.Add(24 * time.Hour))
	if res, err := lim.AllowN(ctx, "first", 2, bigRule); err != nil || !res.Allowed || res.Remaining != bigRule.Capacity-2 {
		t.Fatalf("first call after the server's clock stepped a day = %+v, %v; want admitted, 2 taken", res, err)
	}
	// The commits from now on; ahead of the first, the server's clock
	// steps a day.
	steps.runs.Store(0)
	armed.Store(true)
	if res, err := lim.AllowN(ctx, "first", 3, bigRule); err != nil || !res.Allowed || res.Remaining != bigRule.Capacity-5 {
		t.Fatalf("a call whose clock stepped a day between read and commit = %+v, %v; want admitted, 3 taken", res, err)
	}
	if n := steps.runs.Load(); n != 2 {
		t.Fatalf("%d commits; want 2: one refused, one written", n)
	}
}
