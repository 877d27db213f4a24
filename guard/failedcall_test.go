package guard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testmust"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// A call that failed closed is not charged: guard.Do and the middleware,
// answered ErrUnavailable and 503 because Redis was stopped (SIGSTOP) past
// the guard's Timeout, take nothing once the server is continued and runs
// what they sent. Each path is tried testutil.Tries times (100 by default),
// on the first call of a key (the cooldown, AtMost(1, 1m): the next
// call must be admitted) and on a key with state.

// pausedTimeout is the WithTimeout of the paused-Redis tests.
const pausedTimeout = 20 * time.Millisecond

// pausedGuard is a guard on a server of its own, which the test stops, and
// a Limiter that reads the guard's state with a deadline of its own.
type pausedGuard struct {
	g     *guard.Guard
	stop  *testutil.Stopper
	hook  *stopHook // on the guard's client
	state *funnel.Limiter
	rules []funnel.Rule
}

// A stopHook stops the server before a chosen command of the guard's
// client: a call's commit, sent after its read.
type stopHook struct {
	stop *testutil.Stopper
	left atomic.Int64 // commands until the stop: it fires when this reaches 0
}

// arm makes the n-th command from now stop the server before it is sent.
func (h *stopHook) arm(n int64) { h.left.Store(n) }

// disarm reports whether the armed stop fired, and disarms it.
func (h *stopHook) disarm() bool { return h.left.Swap(0) <= 0 }

// count counts n commands about to be sent, and stops the server if the
// armed one is among them.
func (h *stopHook) count(n int64) {
	if left := h.left.Add(-n); left <= 0 && left > -n {
		_ = h.stop.Stop() // a failed stop shows as an admitted call
	}
}

func (h *stopHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *stopHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(1)
		return next(ctx, cmd)
	}
}

func (h *stopHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// newPausedGuard starts a server and a guard on it with rules and opts
// (the prefix and Timeout set here), and warms it up: scripts loaded, a
// connection open, a sample of the server's clock.
func newPausedGuard(t *testing.T, rules []funnel.Rule, opts ...guard.Option) *pausedGuard {
	t.Helper()
	srv := testutil.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	g, err := guard.New(c, append(opts, guard.WithRules(rules...), guard.WithPrefix("paused"), guard.WithTimeout(pausedTimeout))...)
	if err != nil {
		t.Fatal(err)
	}
	pg := &pausedGuard{g: g, stop: testutil.NewStopper(t, srv.Pid()), state: testmust.Limiter(t, c, funnel.WithPrefix("paused")), rules: rules}
	pg.hook = &stopHook{stop: pg.stop}
	c.AddHook(pg.hook)
	pg.admit(t, "warm-up") // a first script load may take longer than the Timeout
	return pg
}

// admit has the guard admit one call of key before the tries, calling again
// while a call fails closed: with a Timeout of pausedTimeout, a loaded
// machine (CI's second pass) fails some calls of a running server, which
// take nothing (what these tests check); a setup call must not depend on
// the machine's speed.
func (pg *pausedGuard) admit(t *testing.T, key string) {
	t.Helper()
	for i := 0; ; i++ {
		d, err := pg.g.Allow(context.Background(), key)
		if err == nil && d.Allowed {
			return
		}
		if i == 50 {
			t.Fatalf("a unit of %q before the tries: %+v, %v", key, d, err)
		}
	}
}

// remaining is the Remaining of the guard's key, read with a deadline of
// its own (the server has just been continued, on a busy machine).
func (pg *pausedGuard) remaining(t *testing.T, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := pg.state.Peek(ctx, "k:"+key, pg.rules...) // guard's stored key
	if err != nil {
		t.Fatal(err)
	}
	return res.Remaining
}

// stopped runs call on key while the server is stopped, and continues it.
func (pg *pausedGuard) stopped(t *testing.T, key string, call func(key string) error) {
	t.Helper()
	if err := pg.stop.Stop(); err != nil {
		t.Fatal(err)
	}
	err := call(key)
	pg.stop.Cont()
	if err != nil {
		t.Fatal(err)
	}
}

// failedClosedPaths are the ways a call fails closed: each runs one call on
// a stopped server and reports what it answered other than a failure.
var failedClosedPaths = map[string]func(g *guard.Guard, key string) error{
	"Do": func(g *guard.Guard, key string) error {
		ran := false
		d, err := g.Do(context.Background(), key, func(context.Context) error { ran = true; return nil })
		if d.Allowed || ran || !errors.Is(err, guard.ErrUnavailable) {
			return fmt.Errorf("Do on a stopped server = %+v, %v (ran %v); want a denial with ErrUnavailable", d, err, ran)
		}
		return nil
	},
	"Middleware": func(g *guard.Guard, key string) error {
		h := g.Middleware(func(*http.Request) (string, error) { return key, nil })(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/send", nil))
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
			return fmt.Errorf("middleware on a stopped server: %d, Retry-After %q; want 503 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
		}
		return nil
	},
}

// The first call of a key, under the cooldown: after the failed
// call, the next one is admitted (before the fix, it was denied for 59 s).
func TestFailedClosedNotChargedFirstCall(t *testing.T) {
	for name, call := range failedClosedPaths {
		t.Run(name, func(t *testing.T) {
			pg := newPausedGuard(t, []funnel.Rule{funnel.AtMost(1, time.Minute)})
			tries, charged := testutil.Tries(t), 0
			for i := range tries {
				key := fmt.Sprintf("+86136000%05d", i)
				pg.stopped(t, key, func(key string) error { return call(pg.g, key) })
				if pg.remaining(t, key) != 1 {
					charged++
				}
			}
			reportCharged(t, charged, tries)
		})
	}
}

// A key with state: the call goes through the lock, and the server is
// stopped between its read and its commit, which runs once the server is
// continued, inside the lock's lease, after the Timeout.
func TestFailedClosedNotChargedKeyWithState(t *testing.T) {
	big := funnel.Rule{Name: "big", Capacity: 1000, Leak: 1, Per: 1000 * time.Hour}
	for name, call := range failedClosedPaths {
		t.Run(name, func(t *testing.T) {
			pg := newPausedGuard(t, []funnel.Rule{big})
			// Two units: the second through the lock, so that the commit's
			// script is loaded (a commit answered NOSCRIPT by the stopped
			// server would never be sent as EVAL, and never run).
			for range 2 {
				pg.admit(t, "k")
			}
			tries, charged, stopped := testutil.Tries(t), 0, 0
			for i := range tries {
				before := pg.remaining(t, "k")
				pg.hook.arm(2)         // the commit, after the read
				err := call(pg.g, "k") // nil: it failed closed
				fired := pg.hook.disarm()
				pg.stop.Cont()
				if fired {
					stopped++
					if err != nil {
						t.Fatalf("try %d, commit stopped: %v", i, err)
					}
				}
				// Not fired: the read came after the Timeout on a loaded
				// machine (failed closed), or the call was admitted.
				if err == nil && pg.remaining(t, "k") != before {
					charged++
				}
			}
			t.Logf("FIGURE commits stopped | %s | %d of %d tries", t.Name(), stopped, tries)
			reportCharged(t, charged, tries)
		})
	}
}

// FailOpen: a call admitted by the rules in this process (Degraded) took
// nothing in Redis, so Do, whose fn fails once Redis is back, refunds
// nothing there (before: a unit that another call had taken).
func TestFailOpenDoRefundsNothingInRedis(t *testing.T) {
	big := funnel.Rule{Name: "big", Capacity: 1000, Leak: 1, Per: 1000 * time.Hour}
	pg := newPausedGuard(t, []funnel.Rule{big}, guard.WithOnError(guard.FailOpen))
	pg.admit(t, "k")
	before := pg.remaining(t, "k")
	if err := pg.stop.Stop(); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("provider refused")
	d, err := pg.g.Do(context.Background(), "k", func(context.Context) error {
		pg.stop.Cont() // Redis is back before the refund
		return failed
	})
	if !d.Allowed || !d.Degraded || !errors.Is(err, failed) {
		t.Fatalf("Do under FailOpen on a stopped server = %+v, %v; want a Degraded admission and fn's error", d, err)
	}
	if after := pg.remaining(t, "k"); after != before {
		t.Fatalf("Remaining %d after a Degraded Do whose fn failed, %d before; want it unchanged", after, before)
	}
}

// reportCharged fails t when any of tries failed calls was charged.
func reportCharged(t *testing.T, charged, tries int) {
	t.Helper()
	t.Logf("FIGURE failed calls charged | %s | %d of %d", t.Name(), charged, tries)
	if charged > 0 {
		t.Errorf("%d of %d calls that failed closed were charged; want 0", charged, tries)
	}
}
