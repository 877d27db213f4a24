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

// A leader whose time runs out between its lock and its commit (the lock's
// reply came late: the server stopped just after it ran the attempt, or a
// starved process read the reply late) returns by its deadline, without
// waiting for the server, and leaves no lock behind: the lock is released
// as soon as the server answers again, not when its lease ends. It used to
// release with its ended context (2 s of the mutex's own, the caller
// waiting) and, past those, leave the key locked for its lease: every call
// of the key failed meanwhile (TestRecoveryAfterPause under load).
//
// The server is stopped as soon as it answered the lock attempt (read.lua's
// gate, that of a Limiter of uniform cost), and the reply handed over 300
// ms later, past the call's 100 ms deadline. The deadline's timer fires
// late (lateTimer: a loaded machine's, which ctxcall.Ended sees through),
// after the reply came: so the lock is the leader's, with its time run out,
// rather than an attempt abandoned at the deadline (the mutex's concern).
func TestLateCommitLeavesNoLock(t *testing.T) {
	srv := testutil.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	var armed atomic.Bool
	var thaw func()
	var timer *lateTimer
	c.AddHook(&scriptHook{sha: funnel.ReadGateSHA, after: func(redis.Cmder) {
		if armed.CompareAndSwap(true, false) {
			thaw = testutil.Freeze(t, srv.Pid())
			time.Sleep(300 * time.Millisecond) // past the call's deadline
			time.AfterFunc(100*time.Millisecond, timer.fire)
		}
	}})
	lim := mustLimiter(t, c, funnel.WithPrefix(testutil.NewPrefix()), funnel.WithUniformCost(), funnel.WithLease(10*time.Second))
	rule := funnel.Rule{Name: "r", Capacity: 1000, Leak: 1, Per: time.Second}
	warm, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := lim.Allow(warm, "k", rule); err != nil {
		t.Fatal(err)
	}
	timer = newLateTimer(100 * time.Millisecond)
	defer timer.fire()
	armed.Store(true)
	start := time.Now()
	_, err := lim.Allow(timer, "k", rule)
	took := time.Since(start)
	if thaw == nil {
		t.Fatal("the lock attempt was never seen: nothing stalled it")
	}
	thaw()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Allow whose time ran out before its commit = %v, want its deadline's error", err)
	}
	// 100 ms of deadline, 300 ms in the hook and 100 ms more to the
	// timer; the release with an ended context waited 2 s for the stopped
	// server.
	if took > 1500*time.Millisecond {
		t.Errorf("Allow took %v: it waited for the stopped server", took.Round(time.Millisecond))
	}
	next, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := lim.Allow(next, "k", rule); err != nil {
		t.Fatalf("Allow after the server answered again = %v: the late leader's lock was left (lease 10 s)", err)
	}
}

// A lateTimer is a context whose deadline is d but whose Done closes only
// when fire is called: a deadline's timer that fires late.
type lateTimer struct {
	context.Context
	d    time.Time
	done chan struct{}
	once sync.Once
}

// newLateTimer returns a lateTimer whose deadline is in from now.
func newLateTimer(in time.Duration) *lateTimer {
	return &lateTimer{Context: context.Background(), d: time.Now().Add(in), done: make(chan struct{})}
}

func (c *lateTimer) fire()                       { c.once.Do(func() { close(c.done) }) }
func (c *lateTimer) Deadline() (time.Time, bool) { return c.d, true }
func (c *lateTimer) Done() <-chan struct{}       { return c.done }

func (c *lateTimer) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
