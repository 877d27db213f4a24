package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// faultBurstResult is what a burst of Allow calls decided.
type faultBurstResult struct {
	allowed, denied, errs int64
	elapsed               time.Duration // server time, TIME after minus TIME before
	slowestDenial         time.Duration // client time of the slowest call denied
}

// faultBurst makes calls concurrent Allow calls of one unit on key, spread
// over four Limiters (one per client), each call after a random delay of up
// to spread, and returns the decisions and the server time they took (TIME
// read through admin before the first and after the last). during, if not
// nil, runs alongside and gets the number of decisions made so far.
func faultBurst(t *testing.T, lims []*funnel.Limiter, admin *redis.Client, key string, rule funnel.Rule,
	calls int, spread time.Duration, during func(decided *atomic.Int64)) faultBurstResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var allowed, denied, errs, decided, slowest atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range calls {
		lim := lims[i%len(lims)]
		var delay time.Duration
		if spread > 0 {
			delay = rand.N(spread)
		}
		wg.Go(func() {
			<-start
			if delay > 0 {
				time.Sleep(delay)
			}
			began := time.Now()
			res, err := lim.Allow(ctx, key, rule)
			decided.Add(1)
			switch {
			case err != nil:
				errs.Add(1)
			case res.Allowed:
				allowed.Add(1)
			default:
				denied.Add(1)
				took := int64(time.Since(began))
				for old := slowest.Load(); took > old && !slowest.CompareAndSwap(old, took); old = slowest.Load() {
				}
			}
		})
	}
	var side sync.WaitGroup
	if during != nil {
		side.Go(func() { during(&decided) })
	}
	close(start)
	wg.Wait()
	side.Wait()
	t1, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return faultBurstResult{allowed: allowed.Load(), denied: denied.Load(), errs: errs.Load(), elapsed: t1.Sub(t0),
		slowestDenial: time.Duration(slowest.Load())}
}

// TestOverAdmission makes 1,000 concurrent Allow calls on one key from four
// Limiters on four clients, and checks that the calls reported Allowed never
// exceed what the rule admits over the server time the burst took: Capacity
// plus the leak over the time between TIME read before and after. Three
// rounds without a fault, then one with a reply latency on every client and
// one with the server killed and restarted (empty) in the middle; with the
// restart the funnel's state is lost once, so the bound is twice the
// capacity plus the leak.
func TestOverAdmission(t *testing.T) {
	const calls = 1000
	rule := funnel.Rule{Name: "burst", Capacity: 50, Leak: 100, Per: time.Second}
	srv, admin := faultServer(t)
	prefix := testutil.NewPrefix()
	limiters := func(newClient func() *redis.Client) []*funnel.Limiter {
		lims := make([]*funnel.Limiter, 4)
		for i := range lims {
			lims[i] = mustLimiter(t, newClient(), funnel.WithPrefix(prefix))
		}
		return lims
	}
	direct := limiters(func() *redis.Client { return srv.Client(t) })

	check := func(t *testing.T, fault string, rule funnel.Rule, r faultBurstResult, bound int64) {
		t.Helper()
		t.Logf("%s: %d allowed, %d denied, %d errors in %v of server time; bound %d; slowest denial %v",
			fault, r.allowed, r.denied, r.errs, r.elapsed, bound, r.slowestDenial)
		if r.allowed > bound {
			t.Errorf("%s: %d admitted > %d: over-admission of %d", fault, r.allowed, bound, r.allowed-bound)
		}
		if r.allowed < rule.Capacity {
			t.Errorf("%s: %d admitted < capacity %d from an empty funnel: the burst did not exercise the limit", fault, r.allowed, rule.Capacity)
		}
		faultFigure(t, "over-admission: admitted vs bound (capacity + leak over server time)", fault, "%d <= %d (capacity %d, leak %d/%v, %d calls, %v server time, %d errors)",
			r.allowed, bound, rule.Capacity, rule.Leak, rule.Per, calls, r.elapsed.Round(time.Millisecond), r.errs)
		faultFigure(t, "slowest denial in a burst of concurrent calls", fault, "%v", r.slowestDenial.Round(time.Millisecond))
	}

	for round := range 3 {
		r := faultBurst(t, direct, admin, "round-"+string(rune('a'+round)), rule, calls, 0, nil)
		if r.errs > 0 {
			t.Errorf("round %d: %d errors without a fault", round, r.errs)
		}
		check(t, "none, round "+string(rune('1'+round)), rule, r, faultBound(rule, r.elapsed))
	}

	t.Run("latency", func(t *testing.T) {
		x := StartToxi(t, srv.Addr)
		x.Latency(t, "downstream", 2*time.Millisecond, time.Millisecond)
		x.Latency(t, "upstream", time.Millisecond, time.Millisecond)
		lims := limiters(func() *redis.Client { return x.Client(t, nil) })
		// One key's admissions pass its lock one at a time, a few round
		// trips each: a slow leak keeps the funnel full, or the burst would
		// last as long as the lock takes to pass 1,000 admissions.
		slow := funnel.Rule{Name: "slow", Capacity: 50, Leak: 10, Per: time.Second}
		r := faultBurst(t, lims, admin, "latency", slow, calls, 0, nil)
		check(t, "latency 2±1ms replies, 1±1ms requests", slow, r, faultBound(slow, r.elapsed))
	})

	t.Run("kill-restart", func(t *testing.T) {
		if testing.Short() {
			t.Skip("restarts " + testutil.ServerName())
		}
		// Its own server: the kill must not reach the other rounds' data.
		srv, admin := faultServer(t)
		lims := limiters(func() *redis.Client { return srv.Client(t) })
		var down time.Duration
		r := faultBurst(t, lims, admin, "restart", rule, calls, 1500*time.Millisecond, func(decided *atomic.Int64) {
			for decided.Load() < calls/3 {
				time.Sleep(time.Millisecond)
			}
			killed := time.Now()
			if err := srv.Restart(); err != nil {
				t.Errorf("restart: %v", err)
			}
			down = time.Since(killed)
		})
		if r.errs == 0 {
			t.Logf("no call failed across the restart (down %v)", down)
		}
		// State is lost once: a second capacity, and a unit of rounding more.
		bound := faultBound(rule, r.elapsed) + rule.Capacity + 1
		check(t, "kill -9 + restart (down "+down.Round(time.Millisecond).String()+") mid-burst, Allowed only", rule, r, bound)
	})
}

// TestGuardBurstOnOneKey sends a burst of concurrent Allow calls for one key
// to a guard on a healthy Redis with a small network latency (3 ms on
// replies). The calls that find room in the funnel on their first read queue
// for the key's lock in the guard's Locker. The bug this test found: once the
// funnel was full, each queued call was still handed the lock in turn,
// re-read the state under it, declined and passed the lock on, so the tail
// of the queue outwaited WithTimeout and ended as ErrUnavailable, and
// FailOpen admitted 205 against a bound of 7 with Redis up.
//
// What it asserts is the property, not the machine's speed: admissions stay
// within the rule's bound. Under FailClosed a call that outwaits the Timeout
// (a loaded machine makes some) is a denial; under FailOpen it is decided by
// the rule in this process, whose own bound adds to Redis's, so the total
// stays under twice the bound. How many calls were degraded is a figure.
func TestGuardBurstOnOneKey(t *testing.T) {
	const calls = 300
	rule := funnel.Rule{Name: "five", Capacity: 5, Leak: 1, Per: time.Minute}
	srv, admin := faultServer(t)
	x := StartToxi(t, srv.Addr)
	x.Latency(t, "downstream", 3*time.Millisecond, 0)
	for _, mode := range []guard.FailureMode{guard.FailClosed, guard.FailOpen} {
		name := map[guard.FailureMode]string{guard.FailClosed: "FailClosed", guard.FailOpen: "FailOpen"}[mode]
		t.Run(name, func(t *testing.T) {
			// The test is about how calls wait for the key's lock, not for
			// the client's pool or its dials: 64 connections, dialled
			// before the burst (20 queued 300 calls behind 3 ms replies
			// under load; 300 made a dial storm through the proxy).
			const conns = 64
			c := x.Client(t, &redis.Options{PoolSize: conns})
			g, err := guard.New(c, guard.WithPrefix(testutil.NewPrefix()), guard.WithRules(rule), guard.WithOnError(mode))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var dial sync.WaitGroup
			for range conns {
				dial.Go(func() { _ = c.Ping(ctx).Err() })
			}
			dial.Wait()
			t0, err := admin.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			var allowed, degraded atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range calls {
				wg.Go(func() {
					<-start
					d, _ := g.Allow(ctx, "+8613800138000")
					if d.Allowed {
						allowed.Add(1)
					}
					if d.Degraded {
						degraded.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			t1, err := admin.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			bound := faultBound(rule, t1.Sub(t0))
			fault := fmt.Sprintf("%d concurrent calls on one key, 3ms reply latency, Redis up, %s, Timeout %v", calls, name, guard.DefaultTimeout)
			faultFigure(t, "guard burst: decisions degraded (ErrUnavailable) with Redis up", fault, "%d of %d", degraded.Load(), calls)
			faultFigure(t, "guard burst: admitted vs bound", fault, "%d (bound %d, degraded %d)", allowed.Load(), bound, degraded.Load())
			most := bound // FailClosed: a degraded decision is a denial
			if mode == guard.FailOpen {
				// The rule in this process, on the client's clock (at most
				// the server time of the burst plus the calls' timeout).
				most += faultBound(rule, t1.Sub(t0)+guard.DefaultTimeout)
			}
			if allowed.Load() > most {
				t.Errorf("%d admitted > bound %d (%d degraded decisions): over-admission", allowed.Load(), most, degraded.Load())
			}
			if allowed.Load() < rule.Capacity && degraded.Load() == 0 {
				t.Errorf("%d admitted < capacity %d from an empty funnel with Redis answering", allowed.Load(), rule.Capacity)
			}
		})
	}
}
