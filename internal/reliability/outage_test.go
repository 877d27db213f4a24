package reliability

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// Fail fast with go-redis's default options (issue 31). Such a client
// spends 0.4 to 1.7 s on a refused command (5 dials 100 ms apart for each of
// its 4 tries); the guard's outage watch (internal/outage) ends the call
// when its own probe is refused. Sixteen callers ask a FailClosed guard
// (Timeout 500 ms) through a kill -9 of the server, 2 s down, and a restart
// on the same port. Every call made while the server was down is denied
// with ErrUnavailable and ErrUnreachable well before the Timeout; every call
// begun 50 ms after the restart succeeds. The times are figures; the one
// bound asserted (400 ms) is far from the fixed (about 100 ms) and the
// broken (500 ms, the Timeout) behaviour alike.

const outageCallers = 16

// outageCall is one decision: when it began, how long it took, what it
// returned.
type outageCall struct {
	start time.Time
	took  time.Duration
	d     guard.Decision
	err   error
}

func (c outageCall) end() time.Time { return c.start.Add(c.took) }

// outageLoad runs the callers on g, each on a key of its own, until stop is
// closed, and returns their calls.
func outageLoad(g *guard.Guard, stop <-chan struct{}) func() []outageCall {
	var mu sync.Mutex
	var calls []outageCall
	var wg sync.WaitGroup
	for i := range outageCallers {
		key := fmt.Sprint("+1555020", i)
		wg.Go(func() {
			for !faultClosed(stop) {
				start := time.Now()
				d, err := g.Allow(context.Background(), key)
				c := outageCall{start, time.Since(start), d, err}
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
				if err != nil {
					time.Sleep(10 * time.Millisecond) // no hot loop while down
				}
			}
		})
	}
	return func() []outageCall {
		wg.Wait()
		return calls
	}
}

// outageGuard is the guard of these tests: FailClosed, Timeout 500 ms.
func outageGuard(t *testing.T, c redis.UniversalClient) *guard.Guard {
	t.Helper()
	g, err := guard.New(c,
		guard.WithPrefix(testutil.NewPrefix()),
		guard.WithRules(funnel.Rule{Name: "roomy", Capacity: 1 << 40, Leak: 1 << 40, Per: time.Second}),
		guard.WithTimeout(500*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// outageSpread describes the durations of calls: count, p50, p99, max, and
// how many took more than over.
func outageSpread(calls []outageCall, over time.Duration) string {
	if len(calls) == 0 {
		return "no calls"
	}
	d := make([]time.Duration, len(calls))
	n := 0
	for i, c := range calls {
		d[i] = c.took
		if c.took > over {
			n++
		}
	}
	slices.Sort(d)
	q := func(p float64) time.Duration { return d[int(p*float64(len(d)-1))].Round(100 * time.Microsecond) }
	return fmt.Sprintf("%d calls: p50 %v, p99 %v, max %v, %d over %v", len(d), q(0.5), q(0.99), q(1), n, over)
}

// dialErrors reads go-redis's count of failed dials of c's command and
// pipeline pools (its dial circuit breaker opens at the pool's size), or
// -1 where this go-redis keeps it elsewhere. A figure only.
func dialErrors(c *redis.Client) (cmd, pipe int64) {
	read := func(path ...string) (n int64) {
		defer func() {
			if recover() != nil {
				n = -1
			}
		}()
		v := reflect.ValueOf(c).Elem().FieldByName("baseClient").Elem()
		for _, name := range path {
			v = v.FieldByName(name)
			for v.Kind() == reflect.Interface || v.Kind() == reflect.Pointer {
				v = v.Elem()
			}
		}
		return int64((*atomic.Uint32)(unsafe.Pointer(v.FieldByName("dialErrorsNum").UnsafeAddr())).Load())
	}
	return read("connPool"), read("pipelinePool", "pool")
}

func TestRefusedDefaultClient(t *testing.T) {
	for _, ctxTimeout := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeout), func(t *testing.T) {
			srv := testutil.StartServer(t)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxTimeout})
			t.Cleanup(func() { c.Close() })
			stop := make(chan struct{})
			wait := outageLoad(outageGuard(t, c), stop)
			time.Sleep(300 * time.Millisecond)
			srv.Kill()
			killed := time.Now()
			time.Sleep(2 * time.Second)
			cmdErrs, pipeErrs := dialErrors(c)
			restarting := time.Now()
			err := srv.Restart()
			back := time.Now()
			if err == nil {
				time.Sleep(1500 * time.Millisecond)
			}
			close(stop)
			calls := wait()
			if err != nil {
				t.Fatalf("restart: %v", err)
			}
			down := outageDown(t, calls, killed, restarting)
			outageUp(t, calls, back)
			fault := fmt.Sprintf("go-redis defaults, ContextTimeoutEnabled %v, kill -9, %d callers", ctxTimeout, outageCallers)
			faultFigure(t, "refused calls (FailClosed, Timeout 500ms)", fault, "%s", outageSpread(down, 150*time.Millisecond))
			faultFigure(t, "go-redis failed dials in the outage (breaker at pool size)", fault, "command pool %d of %d, pipeline pool %d of %d",
				cmdErrs, c.Options().PoolSize, pipeErrs, redis.DefaultPipelinePoolSize)
		})
	}
}

// outageDown checks the calls that ended between killed and restarting
// (those in flight at the kill too): none took over 400 ms; those begun
// after the kill were denied with ErrUnavailable and ErrUnreachable, the
// others answered or failed with ErrUnavailable. It returns them.
func outageDown(t *testing.T, calls []outageCall, killed, restarting time.Time) []outageCall {
	t.Helper()
	return outageJudge(t, calls, "while down", func(c outageCall) bool {
		return !c.end().Before(killed) && !c.end().After(restarting)
	}, func(c outageCall) string {
		ok := c.err == nil || errors.Is(c.err, guard.ErrUnavailable)
		if c.start.After(killed) {
			ok = !c.d.Allowed && errors.Is(c.err, guard.ErrUnavailable) && errors.Is(c.err, mutex.ErrUnreachable)
		}
		if ok && c.took <= 400*time.Millisecond {
			return ""
		}
		return fmt.Sprintf("call begun %v after the kill: %+v, %v after %v; want a denial with ErrUnavailable and ErrUnreachable within 400ms",
			c.start.Sub(killed).Round(time.Millisecond), c.d, c.err, c.took.Round(time.Millisecond))
	})
}

// outageJudge returns the calls that in selects, and fails t if fewer than
// outageCallers were, or if wrong says anything of one of them (the first
// 5 said, then the count).
func outageJudge(t *testing.T, calls []outageCall, what string, in func(outageCall) bool, wrong func(outageCall) string) []outageCall {
	t.Helper()
	var sel []outageCall
	bad := 0
	for _, c := range calls {
		if !in(c) {
			continue
		}
		sel = append(sel, c)
		if msg := wrong(c); msg != "" {
			if bad++; bad <= 5 {
				t.Error(msg)
			}
		}
	}
	if len(sel) < outageCallers {
		t.Errorf("only %d calls %s", len(sel), what)
	}
	if bad > 0 {
		t.Errorf("%d of %d calls %s failed the check", bad, len(sel), what)
	}
	return sel
}

// outageUp checks that every call begun 50 ms after back succeeded, and
// reports how many took over 100 ms.
func outageUp(t *testing.T, calls []outageCall, back time.Time) {
	t.Helper()
	var after []outageCall
	failed := 0
	for _, c := range calls {
		if c.start.Before(back.Add(50 * time.Millisecond)) {
			continue
		}
		after = append(after, c)
		if c.err != nil || !c.d.Allowed {
			if failed++; failed <= 5 {
				t.Errorf("call begun %v after the restart: %+v, %v", c.start.Sub(back).Round(time.Millisecond), c.d, c.err)
			}
		}
	}
	if len(after) < outageCallers {
		t.Errorf("only %d calls after the restart", len(after))
	}
	if failed > 0 {
		t.Errorf("%d of %d calls begun 50 ms after the restart failed; want none", failed, len(after))
	}
	faultFigure(t, "calls begun 50 ms after the restart", "go-redis defaults", "%d failed; %s", failed, outageSpread(after, 100*time.Millisecond))
}

// A hung server is no refusal: with the server stopped (SIGSTOP), calls
// take the whole Timeout and fail with ErrUnavailable, never with
// ErrUnreachable, and none fails early. The watch's probes connect (the
// kernel queues connections for the stopped server); a probe that times out
// is tested in internal/outage. (With --tcp-backlog 1, so that probes time
// out here too, the calls behave the same, but go-redis's own dials then
// outlive the test by seconds, with or without the watch.)
func TestHungServerIsNoRefusal(t *testing.T) {
	for _, ctxTimeout := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeout), func(t *testing.T) {
			srv := testutil.StartServer(t)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxTimeout})
			t.Cleanup(func() { c.Close() })
			stop := make(chan struct{})
			wait := outageLoad(outageGuard(t, c), stop)
			time.Sleep(300 * time.Millisecond)
			thaw := testutil.Freeze(t, srv.Pid())
			frozen := time.Now()
			time.Sleep(1500 * time.Millisecond)
			thawing := time.Now()
			thaw()
			time.Sleep(300 * time.Millisecond)
			close(stop)
			hung := outageJudge(t, wait(), "while the server was stopped", func(c outageCall) bool {
				return !c.start.Before(frozen) && !c.end().After(thawing)
			}, func(c outageCall) string {
				// The Timeout is a context deadline: no call can end by it sooner.
				if !c.d.Allowed && errors.Is(c.err, guard.ErrUnavailable) && !errors.Is(c.err, mutex.ErrUnreachable) && c.took >= 500*time.Millisecond {
					return ""
				}
				return fmt.Sprintf("call begun %v after SIGSTOP: %+v, %v after %v; want ErrUnavailable, not ErrUnreachable, at the 500ms Timeout",
					c.start.Sub(frozen).Round(time.Millisecond), c.d, c.err, c.took.Round(time.Millisecond))
			})
			faultFigure(t, "calls to a stopped server (FailClosed, Timeout 500ms)", fmt.Sprintf("SIGSTOP, ContextTimeoutEnabled %v", ctxTimeout),
				"%s", outageSpread(hung, 510*time.Millisecond))
		})
	}
}
