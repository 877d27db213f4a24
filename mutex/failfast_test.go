package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// Fail fast: a refused connection ends a call at once, whatever its
// context has left, and the Locker adds nothing to the refusal: callers
// waiting for the same name, or queued to be sent with the refused command,
// get its error instead of making the same attempt in turn. Each refusal
// here takes 200 ms (what go-redis spends on one with its default options,
// roughly): 16 waiters failing one after another would take 3.2 s.

// failFastBound is how long a refused call may take under a 5 s deadline:
// a few refusals at most, on a loaded machine.
const failFastBound = time.Second

func TestRefusedEndsTheWaitOfEveryWaiter(t *testing.T) {
	r := testutil.NewRefused(t, 200*time.Millisecond)
	l := mustNew(t, r.Client(t), mutex.WithPrefix(testutil.NewPrefix()))
	gate := mutex.NewGate("return {1}")
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			var err error
			if i%2 == 0 {
				_, _, err = l.LockWith(ctx, "name", mutex.Call{Fragment: gate})
			} else {
				_, err = l.Lock(ctx, "name")
			}
			if took := time.Since(start); took > failFastBound || !errors.Is(err, mutex.ErrUnreachable) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("caller %d: %v after %v; want ErrUnreachable within %v", i, err, took, failFastBound)
			}
		})
	}
	wg.Wait()
	if n := l.Waiters("name"); n != 0 {
		t.Errorf("%d waiters left", n)
	}
}

// The commands queued behind the Locker's busy slots (send.go) are answered
// with the first refusal, unsent: only the commands in flight dial.
func TestRefusedAnswersTheQueuedCommands(t *testing.T) {
	const calls, slots = 32, 4
	r := testutil.NewRefused(t, 0)
	release := r.HoldDials(t)
	l := mustNew(t, r.Client(t), mutex.WithPrefix(testutil.NewPrefix()))
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			begin := time.Now()
			_, err := l.TryLock(ctx, fmt.Sprint("name", i))
			if !errors.Is(err, mutex.ErrUnreachable) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("TryLock %d: %v after %v; want ErrUnreachable", i, err, time.Since(begin))
			}
		})
	}
	for mutex.BatchQueued(l) < calls-slots {
		time.Sleep(time.Millisecond)
	}
	release()
	wg.Wait()
	if n := mutex.BatchQueued(l); n != 0 {
		t.Errorf("%d commands left queued", n)
	}
	if n := r.Dials(); n != slots {
		t.Errorf("%d dials for %d calls; want the %d in flight: the queued ones answered with their refusal, unsent", n, calls, slots)
	}
}

// A closed client is unreachable too, and so is its Locker at once.
func TestClosedClientIsUnreachable(t *testing.T) {
	b := testutil.Mini(t)
	c := b.Client(t)
	l := mustNew(t, c, mutex.WithPrefix(b.Prefix))
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := l.Lock(ctx, "name")
	if took := time.Since(start); took > failFastBound || !errors.Is(err, mutex.ErrUnreachable) || !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("Lock on a closed client: %v after %v; want ErrUnreachable and redis.ErrClosed at once", err, took)
	}
}

// A hung server may still answer: the call waits for it until its context
// ends, and the error says so (a deadline, not ErrUnreachable).
func TestHungServerCostsTheDeadline(t *testing.T) {
	testutil.NeedServer(t)
	srv := testutil.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	l := mustNew(t, c, mutex.WithPrefix(testutil.NewPrefix()))
	thaw := testutil.Freeze(t, srv.Pid())
	defer thaw()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.Lock(ctx, "name")
	if took := time.Since(start); took < 300*time.Millisecond || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, mutex.ErrUnreachable) {
		t.Fatalf("Lock on a stopped server: %v after %v; want the deadline's error after 300ms", err, took)
	}
}
