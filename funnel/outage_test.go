package funnel_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// An outage is no conflict. ErrConflict says that commits kept losing the
// lock to other writers; the batched calls of one key whose leaders, one
// after another, run out of their own time on a Redis that does not answer
// end with the outage's error (the refusal) or their own context's, never
// with it. They used to count each run that their leader's end made them
// run again as a lost commit: after 8 leaders, ErrConflict.

// outageCalls is how many calls of one key each case makes.
const outageCalls = 24

var outageRule = funnel.Rule{Name: "r", Capacity: 1000, Leak: 1, Per: time.Second}

// An outageKind says how a Redis fails, and so how a call may end.
type outageKind int

const (
	// refusing: it refuses connections, at once or after a while; a call
	// ends with the refusal (ErrUnreachable) or its context's error.
	refusing outageKind = iota
	// hung: it says nothing (a stopped server); a call ends with its
	// context's error, never ErrUnreachable (a hung server may answer).
	hung
	// resumed: hung, then it answers again (the outage's end continues
	// it); a call also may be admitted.
	resumed
)

// An outageCase is a Redis that fails, and the Limiter of a client of it.
type outageCase struct {
	name string
	kind outageKind
	// limit returns the Limiter, and the function that ends the outage.
	limit func(t *testing.T) (lim *funnel.Limiter, end func())
}

// outageServer returns a Limiter on a redis-server of the test's own and a
// client with o's options, with the scripts
// loaded and the key's state written, then the server stopped with
// SIGSTOP (kind hung: the end continues it) or killed, by pid.
func outageServer(kind outageKind, o *redis.Options) func(t *testing.T) (*funnel.Limiter, func()) {
	return func(t *testing.T) (*funnel.Limiter, func()) {
		srv := testutil.StartServer(t)
		opts := *o
		opts.Addr = srv.Addr
		c := redis.NewClient(&opts)
		t.Cleanup(func() { c.Close() })
		lim := mustLimiter(t, c, funnel.WithPrefix(testutil.NewPrefix()))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for range 3 {
			if _, err := lim.Allow(ctx, "k", outageRule); err != nil {
				t.Fatalf("Allow while the server answers: %v", err)
			}
		}
		if kind == hung {
			return lim, testutil.Freeze(t, srv.Pid())
		}
		srv.Kill()
		return lim, func() {}
	}
}

// outageRefused returns a Limiter of a Refused with delay, whose dials
// wait until the outage ends (or the test does) if hold, with a client
// of o's options but for the address and the dialer.
func outageRefused(delay time.Duration, hold bool, o *redis.Options) func(t *testing.T) (*funnel.Limiter, func()) {
	return func(t *testing.T) (*funnel.Limiter, func()) {
		r := testutil.NewRefused(t, delay)
		end := func() {}
		if hold {
			end = r.HoldDials(t)
		}
		return mustLimiter(t, r.ClientOpts(t, o)), end
	}
}

// The clients of the cases: go-redis's defaults (it ignores context
// deadlines: the libraries leave a call at its deadline, see
// internal/ctxcall), ctxDeadlines, and ctxOneDial, which sends a refused
// command once (one dial, no retry). All with a pool large enough that
// go-redis's dial circuit breaker, which opens after PoolSize failed dials
// and probes once a second from a goroutine of its own, stays shut.
var (
	defaultClient = &redis.Options{PoolSize: 4096}
	ctxDeadlines  = &redis.Options{ContextTimeoutEnabled: true, PoolSize: 4096}
	ctxOneDial    = &redis.Options{ContextTimeoutEnabled: true, PoolSize: 4096, DialerRetries: 1, MaxRetries: -1}
)

// Calls with deadlines a step apart: each leader runs out of time in turn.
// The call that joins last has the shortest deadline but the first's: the
// calls that run again after a leader's end join again in the order they
// are woken, and Go's scheduler runs the one woken last first, so the
// leader is often the call with the least time left (not always: the
// cases with a leader whose deadline comes late end sooner).
func TestOutageIsNoConflict(t *testing.T) {
	cases := []outageCase{
		// One dial, refused after 600 ms: the calls with a later deadline
		// end with the refusal.
		{"refused after 600 ms, ctx-deadlines, one dial", refusing, outageRefused(600*time.Millisecond, false, ctxOneDial)},
		// go-redis's defaults dial 5 times for each of 4 tries, 100 ms a
		// dial here: every call ends at its deadline.
		{"refused after 100 ms a dial, default-client", refusing, outageRefused(100*time.Millisecond, false, defaultClient)},
		{"killed, default-client", refusing, outageServer(refusing, defaultClient)},
		{"killed, ctx-deadlines", refusing, outageServer(refusing, ctxDeadlines)},
		{"stopped, default-client", hung, outageServer(hung, defaultClient)},
		{"stopped, ctx-deadlines", hung, outageServer(hung, ctxDeadlines)},
	}
	const step = 50 * time.Millisecond
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lim, _ := c.limit(t)
			watch := newBatchWatch()
			out := make([]outageOutcome, outageCalls)
			var wg sync.WaitGroup
			for i := range outageCalls {
				d := time.Duration(outageCalls-i+1) * step
				if i == 0 {
					d = step
				}
				ctx, cancel := context.WithTimeout(context.Background(), d)
				defer cancel()
				var returned atomic.Bool
				wg.Go(func() {
					watch.labelCall(i)
					out[i] = outageCall(ctx, lim, i)
					returned.Store(true)
				})
				// It leads, or joined the batch (or already returned).
				if v, ok := watch.until(time.Minute, func(v batchView) bool {
					return v.leaders[i] || v.waiters[i] || returned.Load()
				}); !ok { // a hang's bound, not a speed target
					t.Fatalf("call %d neither leads nor waits in a batch: %d leading, %d waiting", i, v.leading, v.waiting)
				}
			}
			wg.Wait()
			outageJudge(t, c.kind, out)
		})
	}
}

// The same, in turn: every call's context has a minute, and the test ends
// each batch's leader (cancels its context) once all the other calls have
// joined its batch, 8 times; then the outage ends: the refusal comes, or
// the stopped server is continued. The 16 calls that ran again 8 times
// all ended in ErrConflict.
func TestOutageLeadersEndInTurn(t *testing.T) {
	cases := []outageCase{
		{"refused, held, ctx-deadlines, one dial", refusing, outageRefused(0, true, ctxOneDial)},
		{"refused, held, default-client", refusing, outageRefused(0, true, defaultClient)},
		// Not a stopped server with ctx-deadlines: go-redis ends a command
		// by its context's deadline there, not by its cancel.
		{"stopped, default-client", resumed, outageServer(hung, defaultClient)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lim, end := c.limit(t)
			outageJudge(t, c.kind, outageInTurn(t, lim, 8, end))
		})
	}
}

// outageInTurn makes outageCalls calls of one key of lim and ends the
// leader of their batch, rounds times, each once the calls left have all
// entered it (one leads, the others wait in its batch); then it ends the
// outage (end) and returns the outcomes.
func outageInTurn(t *testing.T, lim *funnel.Limiter, rounds int, end func()) []outageOutcome {
	watch := newBatchWatch()
	out := make([]outageOutcome, outageCalls)
	cancels := make([]context.CancelFunc, outageCalls)
	returned := make([]chan struct{}, outageCalls)
	var wg sync.WaitGroup
	for i := range outageCalls {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang's bound
		defer cancel()
		cancels[i], returned[i] = cancel, make(chan struct{})
		wg.Go(func() {
			defer close(returned[i])
			watch.labelCall(i)
			out[i] = outageCall(ctx, lim, i)
		})
	}
	live := outageCalls
	for r := range rounds {
		// A minute at most: a hang's bound, not a speed target.
		v, ok := watch.until(time.Minute, func(v batchView) bool { return v.leading == 1 && v.waiting == live-1 })
		if !ok || len(v.leaders) != 1 {
			t.Fatalf("round %d: %d calls lead (%v) and %d wait in a batch; want 1 and %d", r, v.leading, v.leaders, v.waiting, live-1)
		}
		for i := range v.leaders {
			cancels[i]()
			<-returned[i]
		}
		live--
	}
	end()
	wg.Wait()
	return out
}

// An outageOutcome is one call's.
type outageOutcome struct {
	i      int
	took   time.Duration
	err    error
	ctxErr error // its ctx's error when it returned
}

// outageCall is call i of i+1 units under ctx.
func outageCall(ctx context.Context, lim *funnel.Limiter, i int) outageOutcome {
	start := time.Now()
	_, err := lim.AllowN(ctx, "k", int64(i+1), outageRule)
	ctxErr := ctx.Err()
	if d, ok := ctx.Deadline(); ctxErr == nil && ok && !time.Now().Before(d) {
		// Its deadline passed, its timer not run yet (a loaded machine): the
		// socket's deadline, the same time, may have ended the call first.
		ctxErr = context.DeadlineExceeded
	}
	return outageOutcome{i: i, took: time.Since(start), err: err, ctxErr: ctxErr}
}

// judge says what is wrong with o ("" if nothing) in an outage of kind: it
// must be an error matching ErrUnreachable (where Redis refuses) or its own
// ctx's error, or an admission (where Redis answers again), and never
// ErrConflict.
func (o outageOutcome) judge(kind outageKind) string {
	switch {
	case o.err == nil && kind == resumed:
		return ""
	case o.err == nil:
		return fmt.Sprintf("call %d: no error while Redis was down", o.i)
	case errors.Is(o.err, funnel.ErrConflict):
		return fmt.Sprintf("call %d: ErrConflict after %v: %v", o.i, o.took.Round(time.Millisecond), o.err)
	case o.ctxErr != nil && errors.Is(o.err, o.ctxErr):
		return ""
	case errors.Is(o.err, funnel.ErrUnreachable) && kind == refusing:
		return ""
	}
	return fmt.Sprintf("call %d: %v (its ctx: %v)", o.i, o.err, o.ctxErr)
}

// outageJudge fails t for each outcome that judge finds wrong, and logs
// the counts of each kind.
func outageJudge(t *testing.T, kind outageKind, out []outageOutcome) {
	t.Helper()
	var bad []string
	for _, o := range out {
		if msg := o.judge(kind); msg != "" {
			bad = append(bad, msg)
		}
	}
	t.Logf("%s", outageSummary(out))
	if len(bad) > 0 {
		t.Errorf("%d of %d calls ended wrong:\n%s", len(bad), len(out), strings.Join(bad, "\n"))
	}
}

// outageSummary counts the outcomes by kind, with the longest time each
// kind took.
func outageSummary(out []outageOutcome) string {
	type kind struct {
		n   int
		max time.Duration
	}
	kinds := map[string]*kind{}
	for _, o := range out {
		name := "other"
		switch {
		case o.err == nil:
			name = "admitted"
		case errors.Is(o.err, funnel.ErrConflict):
			name = "ErrConflict"
		case errors.Is(o.err, funnel.ErrUnreachable):
			name = "ErrUnreachable"
		case errors.Is(o.err, context.DeadlineExceeded):
			name = "deadline"
		case errors.Is(o.err, context.Canceled):
			name = "canceled"
		}
		if kinds[name] == nil {
			kinds[name] = &kind{}
		}
		kinds[name].n++
		kinds[name].max = max(kinds[name].max, o.took)
	}
	var parts []string
	for name, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s: %d (up to %v)", name, k.n, k.max.Round(time.Millisecond)))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
