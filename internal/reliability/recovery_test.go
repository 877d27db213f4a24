package reliability

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// Recover at once (principle 11): once the server answers again, no call
// fails or waits because of calls that gave up before. Sixteen goroutines
// ask a guard without pause, on four returning keys, through a stop of the
// server (SIGSTOP for a second, then SIGCONT) and through a kill and a
// restart on the same port; a call begun 50 ms after it answers again must
// neither fail nor take over 100 ms. Calls cut short by the outage leave commands
// behind: an attempt whose caller left runs when the server continues, and
// takes the key's lock under a token nobody holds. The funnel's lease (3 s)
// is longer than the guard's Timeout (500 ms), so a call that waited for
// such a lock would fail: the test counts errors, not milliseconds.
// WithUniformCost makes every admission take the lock (no one-round-trip
// admission whose deadline keeps a late gate from locking).

const recoveryCallers = 16

// recoveryCall is one decision: when it began, and its error.
type recoveryCall struct {
	start time.Time
	took  time.Duration
	err   error
}

// recoveryLoad runs the callers on g, on four keys from base, until stop is
// closed and returns their calls.
func recoveryLoad(g *guard.Guard, base string, stop <-chan struct{}) func() []recoveryCall {
	var mu sync.Mutex
	var calls []recoveryCall
	var wg sync.WaitGroup
	for i := range recoveryCallers {
		key := fmt.Sprint(base, i%4)
		wg.Go(func() {
			for !faultClosed(stop) {
				start := time.Now()
				_, err := g.Allow(context.Background(), key)
				mu.Lock()
				calls = append(calls, recoveryCall{start, time.Since(start), err})
				mu.Unlock()
				if err != nil {
					time.Sleep(10 * time.Millisecond) // no hot loop while down
				}
			}
		})
	}
	return func() []recoveryCall {
		wg.Wait()
		return calls
	}
}

// recoveryGuard is the guard of the recovery tests on client c.
func recoveryGuard(t *testing.T, c *redis.Client) *guard.Guard {
	t.Helper()
	g, err := guard.New(c,
		guard.WithPrefix(testutil.NewPrefix()),
		guard.WithRules(funnel.Rule{Name: "busy", Capacity: 1 << 40, Leak: 1 << 40, Per: time.Second}),
		guard.WithTimeout(500*time.Millisecond),
		guard.WithFunnel(funnel.WithUniformCost(), funnel.WithLease(3*time.Second)),
	)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// recoverySlow is how much longer than the machine's slowest control call a
// call begun 50 ms after the outage may take (issue 31: no error and no
// answer over 100 ms, on a machine that answers its control calls at once).
const recoverySlow = 100 * time.Millisecond

// recoveryCheck fails t if a call begun 50 ms or more after back failed or
// took recoverySlow more than the slowest control call, or if no call before failed (the outage was not
// felt). The control calls are calls begun 50 ms after back on keys and a
// client the outage never touched (its own guard and pool), which nothing
// left behind can delay: what the machine itself costs a call then. A call
// may take recoverySlow more than the slowest of them: on a loaded 2-core
// VM under the race detector the slowest of 1,500 calls and the slowest of
// 1,500 others differ by tens of milliseconds (CI saw 142 ms beside 69 ms)
// with nothing left behind, while what a leftover costs (a lock it holds
// for the funnel's 3 s lease, a dial refused until the breaker's probe)
// is an error or a second. It reports false, failing
// nothing, when a control call failed or took over 3 times recoverySlow:
// then the machine, not a leftover, failed the calls (the test process and
// the server waited up to 1 s for a CPU after SIGCONT), and the run proves
// nothing either way.
func recoveryCheck(t *testing.T, calls, control []recoveryCall, back time.Time) bool {
	t.Helper()
	var during, after, failedAfter, controlFailed int
	var slowest, controlSlowest time.Duration
	for _, c := range control {
		if c.start.After(back.Add(50 * time.Millisecond)) {
			controlSlowest = max(controlSlowest, c.took)
			if c.err != nil {
				controlFailed++
			}
		}
	}
	var first []string
	for _, c := range calls {
		switch {
		case c.start.After(back.Add(50 * time.Millisecond)):
			after++
			slowest = max(slowest, c.took)
			if c.err != nil {
				failedAfter++
				if failedAfter <= 5 {
					first = append(first, fmt.Sprintf("call begun %v after the server answered again: %v", c.start.Sub(back).Round(time.Millisecond), c.err))
				}
			}
		case c.err != nil: // cut short by the outage, or begun in it
			during++
		}
	}
	t.Logf("%d calls failed in the outage; %d of %d calls begun after it failed, the slowest took %v; %d of %d control calls failed, the slowest took %v", during, failedAfter, after, slowest.Round(time.Millisecond), controlFailed, len(control), controlSlowest.Round(time.Millisecond))
	if controlFailed > 0 || controlSlowest > 3*recoverySlow {
		return false
	}
	allowed := recoverySlow + controlSlowest
	for _, f := range first {
		t.Error(f)
	}
	if during == 0 {
		t.Errorf("no call failed during the outage: it was not felt, the test proves nothing")
	}
	if after < recoveryCallers || len(control) == 0 {
		t.Errorf("only %d calls and %d control calls begun after the outage", after, len(control))
	}
	if failedAfter > 0 {
		t.Errorf("%d calls begun after the server answered again failed; want none", failedAfter)
	}
	if slowest > allowed {
		t.Errorf("a call begun after the server answered again took %v; want none over %v (the control calls' slowest %v)",
			slowest.Round(time.Millisecond), allowed, controlSlowest.Round(time.Millisecond))
	}
	return true
}

// recoveryAttempts is how many times a recovery test runs its outage while
// control calls fail too (see recoveryCheck).
const recoveryAttempts = 5

// recoveryRun runs outage, which makes the server unavailable and returns
// when it answers again, under the callers of a guard on c, and checks the
// calls (recoveryCheck): again while the run proved nothing, up to
// recoveryAttempts times.
func recoveryRun(t *testing.T, c func() *redis.Client, outage func() (time.Time, error)) {
	t.Helper()
	for range recoveryAttempts {
		stop := make(chan struct{})
		wait := recoveryLoad(recoveryGuard(t, c()), "+1555010", stop)
		time.Sleep(300 * time.Millisecond)
		back, err := outage()
		if err != nil {
			close(stop)
			wait()
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		waitControl := recoveryLoad(recoveryGuard(t, c()), "+1555020", stop)
		time.Sleep(1450 * time.Millisecond)
		close(stop)
		if recoveryCheck(t, wait(), waitControl(), back) {
			return
		}
	}
	t.Errorf("control calls on untouched keys and a fresh client failed or took over %v in each of %d runs: the machine could not serve fresh calls, so the test could not tell", 3*recoverySlow, recoveryAttempts)
}

func TestRecoveryAfterPause(t *testing.T) {
	srv := testutil.StartServer(t)
	client := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}
	recoveryRun(t, client, func() (time.Time, error) {
		thaw := testutil.Freeze(t, srv.Pid())
		time.Sleep(time.Second)
		thaw()
		return time.Now(), nil
	})
}

// After a restart the server is empty (no lock survives), but the client's
// pooled connections are dead. go-redis's dial circuit breaker, which opens
// after PoolSize failed dials and then answers every dial with the last
// refusal until its probe, once a second, succeeds, is kept out of this
// test with a large pool: RELIABILITY.md says what it costs.
func TestRecoveryAfterRestart(t *testing.T) {
	srv := testutil.StartServer(t)
	client := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 4096, PipelinePoolSize: 4096})
		t.Cleanup(func() { c.Close() })
		return c
	}
	recoveryRun(t, client, func() (time.Time, error) {
		srv.Kill()
		time.Sleep(500 * time.Millisecond)
		if err := srv.Restart(); err != nil {
			return time.Time{}, fmt.Errorf("restart: %w", err)
		}
		return time.Now(), nil
	})
}
