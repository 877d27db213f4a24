package funnel_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// heldLimiter returns a Limiter whose client holds every command until
// release, a counter of the commands it sends, and a watch of the calls
// that the current goroutine starts from now on (which of them wait in a
// batch).
func heldLimiter(t *testing.T, b *testutil.Backend, rule funnel.Rule, key string, opts ...funnel.Option) (*funnel.Limiter, *testutil.CommandCounter, func(), *batchWatch) {
	t.Helper()
	return heldLimiterHooked(t, b, nil, rule, key, opts...)
}

// heldLimiterHooked is heldLimiter with hook, if not nil, on the client too,
// under the hold (it sees the commands once released), from the start: the
// warm-up's commands go through it.
func heldLimiterHooked(t *testing.T, b *testutil.Backend, hook redis.Hook, rule funnel.Rule, key string, opts ...funnel.Option) (*funnel.Limiter, *testutil.CommandCounter, func(), *batchWatch) {
	t.Helper()
	client := b.Client(t)
	counter := &testutil.CommandCounter{}
	client.AddHook(counter)
	if hook != nil {
		client.AddHook(hook)
	}
	// Without the state cache: a key this Limiter wrote would be admitted
	// in the returning key's gate, one call at a time (see
	// TestReturningHotKeyBatches).
	lim := mustLimiter(t, client, append([]funnel.Option{funnel.WithPrefix(b.Prefix), funnel.WithStateCache(0)}, opts...)...)
	// Scripts loaded and the connection open before the hold: the counts
	// are of the calls under test. And the key under test has state (one
	// unit), as it would after a first call (admitted in one round trip,
	// with no lock hold), so that its calls go through the lock.
	for range 2 { // the first on a key with no state, the second through the lock
		if _, err := lim.Allow(context.Background(), "warm-up", funnel.AtMost(2, time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := lim.Allow(context.Background(), key, rule); err != nil || !res.Allowed {
		t.Fatalf("the first unit of %s: %+v, %v", key, res, err)
	}
	hold, release := testutil.HoldHook()
	client.AddHook(hold)
	t.Cleanup(release)
	counter.N.Store(0)
	return lim, counter, release, newBatchWatch()
}

// The calls that arrive while one takes the lock share its hold: ten calls,
// one read and one write, decided in arrival order (the first five of a
// capacity of five admitted), each with its own Result.
func TestBatchSharesOneHold(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		rule := funnel.Rule{Name: "five", Capacity: 6, Leak: 1, Per: 24 * time.Hour}
		// A first unit: a key with no state is admitted in the read's round
		// trip, without a lock hold to share.
		lim, counter, release, watch := heldLimiter(t, b, rule, "hot")
		ctx := context.Background()
		results := make([]funnel.Result, 10)
		errs := make([]error, 10)
		var wg sync.WaitGroup
		for i := range 10 { // one leads (its lock attempt is held), nine join it

			wg.Go(func() { results[i], errs[i] = lim.Allow(ctx, "hot", rule) })
		}
		awaitJoins(t, watch, 9)
		release()
		wg.Wait()
		admitted := 0
		for i, r := range results {
			if errs[i] != nil {
				t.Fatalf("call %d: %v", i, errs[i])
			}
			if r.Allowed {
				admitted++
				if r.Remaining < 0 || r.Remaining > 4 {
					t.Fatalf("call %d: %+v", i, r)
				}
			} else if r.Rule != "five" || r.RetryAfter <= 0 {
				t.Fatalf("call %d denied without a rule or a wait: %+v", i, r)
			}
		}
		if admitted != 5 {
			t.Fatalf("%d of 10 admitted; want the capacity, 5", admitted)
		}
		// Each admitted call saw the units of those before it: remaining
		// 4, 3, 2, 1, 0, each once.
		seen := map[int64]bool{}
		for _, r := range results {
			if r.Allowed {
				seen[r.Remaining] = true
			}
		}
		if len(seen) != 5 {
			t.Fatalf("remaining counts %v; want 4 down to 0, once each", seen)
		}
		if got := counter.N.Load(); got != 2 {
			t.Fatalf("%d commands for 10 calls; want 2: one lock and read, one write and release", got)
		}
		peek, err := lim.Peek(ctx, "hot", rule)
		if err != nil || peek.Remaining != 0 || peek.Allowed {
			t.Fatalf("Peek = %+v, %v; want the funnel full, every admission stored", peek, err)
		}
	})
}

// Batched admissions are exact: concurrent calls of 1 to 3 units from 64
// goroutines on two Limiters (two processes) admit exactly what the state
// holds, never past the capacity, and deny only calls that did not fit.
func TestBatchedExact(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		const capacity = 150
		rule := funnel.Rule{Name: "exact", Capacity: capacity, Leak: 1, Per: 24 * time.Hour}
		lims := []*funnel.Limiter{newLimiter(t, b), newLimiter(t, b)}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang, not a speed target
		defer cancel()
		admitted, smallestDenied := raceUnits(t, ctx, lims, "exact", rule, 5)
		sum := admitted.Load()
		peek, err := lims[0].Peek(ctx, "exact", rule)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d units admitted of 320 calls, the smallest call denied %d units, %d left", sum, smallestDenied.Load(), peek.Remaining)
		if sum > capacity || peek.Remaining != capacity-sum {
			t.Fatalf("%d units admitted, %d left in Redis; want at most %d, and what was admitted stored once", sum, peek.Remaining, capacity)
		}
		// Levels only grow here: a call denied at its turn did not fit in
		// what was left at the end either.
		if d := smallestDenied.Load(); d <= capacity-sum {
			t.Fatalf("a call of %d units was denied, yet %d units were left", d, capacity-sum)
		}
	})
}

// A batch whose lock lease lapses before its write (a paused process, while
// another Limiter admits) is decided again, every call of it, on the state
// the other wrote: none admitted twice, none lost.
func TestBatchLeaseLapse(t *testing.T) {
	const lease = 500 * time.Millisecond
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		rule := funnel.Rule{Name: "day", Capacity: 5, Leak: 1, Per: 24 * time.Hour} // the first unit, then 4
		ctx := context.Background()
		limB := newLimiter(t, b, funnel.WithLease(lease))
		// A's commits: the first, once armed (after the warm-up), stalls
		// past the lease, while B admits.
		var armed, stalled atomic.Bool
		var resB funnel.Result
		var errB error
		commits := &scriptHook{sha: funnel.WriteBackSHA, before: func(redis.Cmder) {
			if !armed.Load() || !stalled.CompareAndSwap(false, true) {
				return
			}
			if b.Mini != nil {
				b.Mini.FastForward(lease + time.Millisecond)
			} else {
				time.Sleep(lease + 30*time.Millisecond)
			}
			resB, errB = limB.AllowN(ctx, "lapse", 2, rule)
		}}
		limA, _, release, watch := heldLimiterHooked(t, b, commits, rule, "lapse", funnel.WithLease(lease))
		commits.runs.Store(0)
		armed.Store(true)
		results := make([]funnel.Result, 4)
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() { results[i], errs[i] = limA.Allow(ctx, "lapse", rule) })
		}
		awaitJoins(t, watch, 3)
		release()
		wg.Wait()
		if !stalled.Load() {
			t.Fatal("A's commit was never seen: nothing stalled it")
		}
		if errB != nil || !resB.Allowed {
			t.Fatalf("B, admitting 2 while A's lease had lapsed: %+v, %v", resB, errB)
		}
		units := int64(2)
		for i, r := range results {
			if errs[i] != nil {
				t.Fatalf("A's call %d: %v", i, errs[i])
			}
			if r.Allowed {
				units++
			}
		}
		if c := commits.runs.Load(); c != 2 {
			t.Fatalf("%d commits of A's batch; want 2: the lapsed one, then one on B's state", c)
		}
		if units != 4 {
			t.Fatalf("%d units admitted in all (B's 2 and A's); want the capacity left, 4", units)
		}
		peek, err := limB.Peek(ctx, "lapse", rule)
		if err != nil || peek.Remaining != 0 {
			t.Fatalf("Peek = %+v, %v; want a full funnel, every admission stored once", peek, err)
		}
	})
}

// A call whose context ends while it waits in a batch returns its context's
// error and takes nothing; the leader's context ending makes the others run
// again under theirs, and they are admitted.
func TestBatchContexts(t *testing.T) {
	b := testutil.Mini(t)
	rule := funnel.Rule{Name: "ten", Capacity: 10, Leak: 1, Per: 24 * time.Hour}

	t.Run("a waiter leaves", func(t *testing.T) {
		lim, _, release, watch := heldLimiter(t, b, rule, "leave")
		var wg sync.WaitGroup
		var leaderErr error
		wg.Go(func() { _, leaderErr = lim.Allow(context.Background(), "leave", rule) })
		awaitLeader(t, watch) // the waiter comes second
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { _, err := lim.Allow(ctx, "leave", rule); errc <- err }()
		awaitJoins(t, watch, 1)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("the waiter whose context ended: %v; want context.Canceled", err)
		}
		release()
		wg.Wait()
		if leaderErr != nil {
			t.Fatal(leaderErr)
		}
		peek, err := lim.Peek(context.Background(), "leave", rule)
		if err != nil || peek.Remaining != 8 {
			t.Fatalf("Peek = %+v, %v; want 8 left (the first unit, the leader's): the waiter that left took nothing", peek, err)
		}
	})

	t.Run("the leader leaves", func(t *testing.T) {
		lim, _, release, watch := heldLimiter(t, b, rule, "lead")
		ctx, cancel := context.WithCancel(context.Background())
		leader := make(chan error, 1)
		go func() { _, err := lim.Allow(ctx, "lead", rule); leader <- err }()
		awaitLeader(t, watch) // the others come after it
		results := make([]funnel.Result, 3)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() { results[i], errs[i] = lim.Allow(context.Background(), "lead", rule) })
		}
		awaitJoins(t, watch, 3)
		cancel()
		if err := <-leader; !errors.Is(err, context.Canceled) {
			t.Fatalf("the leader whose context ended: %v; want context.Canceled", err)
		}
		release()
		wg.Wait()
		for i := range 3 {
			if errs[i] != nil || !results[i].Allowed {
				t.Fatalf("waiter %d: %+v, %v; want admitted in a batch of its own", i, results[i], errs[i])
			}
		}
		peek, err := lim.Peek(context.Background(), "lead", rule)
		if err != nil || peek.Remaining != 6 {
			t.Fatalf("Peek = %+v, %v; want 6 left: the first unit and the three waiters'", peek, err)
		}
	})
}

// WithoutBatching: every call takes the lock for itself.
func TestWithoutBatching(t *testing.T) {
	b := testutil.Mini(t)
	rule := funnel.Rule{Name: "ten", Capacity: 10, Leak: 1, Per: 24 * time.Hour}
	lim, counter, release, watch := heldLimiter(t, b, rule, "alone", funnel.WithoutBatching())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := lim.Allow(context.Background(), "alone", rule); err != nil {
				t.Error(err)
			}
		})
	}
	// The calls are held: none can have finished. Each leads its own
	// lock attempt; none waits in a batch.
	v, _ := watch.until(time.Minute, func(v batchView) bool { return v.leading+v.waiting == 4 })
	if v.leading != 4 || v.waiting != 0 {
		t.Fatalf("of 4 held calls, %d lead and %d wait in a batch; want 4 leading, without batching", v.leading, v.waiting)
	}
	release()
	wg.Wait()
	if got := counter.N.Load(); got < 8 {
		t.Fatalf("%d commands for 4 calls; want at least 8, a lock and a write each", got)
	}
}

// raceUnits has 64 goroutines, spread over lims, each make calls calls of
// 1 to 3 units on key, all started at once; it returns the units admitted
// and the smallest call denied (1<<62 if none).
func raceUnits(t *testing.T, ctx context.Context, lims []*funnel.Limiter, key string, rule funnel.Rule, calls int) (admitted, smallestDenied *atomic.Int64) {
	admitted, smallestDenied = new(atomic.Int64), new(atomic.Int64)
	smallestDenied.Store(1 << 62)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			<-start
			for i := range calls {
				n := int64(1 + (g+i)%3)
				res, err := lims[g%len(lims)].AllowN(ctx, key, n, rule)
				if err != nil {
					t.Errorf("AllowN: %v", err)
					return
				}
				if res.Allowed {
					admitted.Add(n)
				} else {
					for old := smallestDenied.Load(); n < old && !smallestDenied.CompareAndSwap(old, n); old = smallestDenied.Load() {
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()
	return admitted, smallestDenied
}
