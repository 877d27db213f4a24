package ctxcall_test

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// goid is the id of the calling goroutine, from its stack's first line.
func goid() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	return string(bytes.Fields(b)[1])
}

// Calls made one after another run in one worker goroutine, not the
// caller's and not a new one each.
func TestWorkersReuseOneGoroutine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := ctxcall.NewWorkers()
	caller := goid()
	seen := map[string]int{}
	for range 200 {
		id, err := ctxcall.Do(ctx, w, func(context.Context) (string, error) { return goid(), nil }, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen[id]++
	}
	if seen[caller] > 0 {
		t.Fatalf("%d calls ran in the caller's goroutine", seen[caller])
	}
	// A worker ends after Idle without a call: a descheduled caller (a
	// loaded machine) may see a second one start. 200 calls in 200
	// goroutines is the bug.
	if len(seen) > 20 {
		t.Fatalf("200 serial calls ran in %d goroutines, want them to reuse a worker", len(seen))
	}
}

// Calls made at once each get a goroutine: none waits for another's worker
// (each call here waits until all 16 are running).
func TestWorkersRunConcurrentCallsAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := ctxcall.NewWorkers()
	const n = 16
	var inside sync.WaitGroup
	inside.Add(n)
	var callers sync.WaitGroup
	for range n {
		callers.Go(func() {
			_, err := ctxcall.Do(ctx, w, func(context.Context) (int, error) {
				inside.Done()
				inside.Wait()
				return 0, nil
			}, nil)
			if err != nil {
				t.Error(err)
			}
		})
	}
	callers.Wait()
}

// A worker whose caller left (its call abandoned) hands the outcome to
// late and serves the next call; once calls stop, every worker ends.
func TestWorkersEndWhenIdle(t *testing.T) {
	w := ctxcall.NewWorkers()
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	lateGot := make(chan int, 1)
	go func() { time.Sleep(time.Millisecond); cancel() }()
	if _, err := ctxcall.Do(ctx, w, func(context.Context) (int, error) { <-release; return 7, nil }, func(v int, _ error) { lateGot <- v }); err == nil {
		t.Fatal("an abandoned call reported no error")
	}
	close(release)
	if v := <-lateGot; v != 7 {
		t.Fatalf("late got %d", v)
	}
	live, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	if v, err := ctxcall.Do(live, w, func(context.Context) (int, error) { return 8, nil }, nil); v != 8 || err != nil {
		t.Fatalf("Do after an abandoned call = %v, %v", v, err)
	}
	// A worker ends Idle after its last call.
	if err := testutil.Leaks(time.Second); err != nil {
		t.Fatal(err)
	}
}
