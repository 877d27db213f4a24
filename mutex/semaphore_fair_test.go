package mutex_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// TestSemaphoreNoStarvation: an Acquire of all 4 permits queued among a
// stream of Acquire(1) and TryAcquire(1) from 16 goroutines on two Lockers gets them: a release
// grants in queue order and stops at the first waiter that does not fit,
// so the small ones queued after it cannot overtake it.
func TestSemaphoreNoStarvation(t *testing.T) {
	b := testutil.RealBackend(t)
	small := mustSem(t, newLocker(t, b, mutex.WithRetryInterval(10*time.Millisecond)), "fair", 4)
	small2 := mustSem(t, newLocker(t, b, mutex.WithRetryInterval(10*time.Millisecond)), "fair", 4)
	big := mustSem(t, newLocker(t, b), "fair", 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var taken atomic.Int64
	for i := range 16 {
		s := []*mutex.Semaphore{small, small2}[i%2]
		wg.Go(func() {
			for ctx.Err() == nil {
				p, err := take(ctx, s, 1, 10*time.Second, i%4 == 0)
				if err != nil {
					return
				}
				taken.Add(1)
				time.Sleep(5 * time.Millisecond)
				_ = p.Release(context.Background())
			}
		})
	}
	defer wg.Wait()
	defer cancel()
	for taken.Load() < 100 {
		time.Sleep(time.Millisecond) // the stream is flowing
	}
	bctx, bcancel := context.WithTimeout(ctx, 10*time.Second)
	defer bcancel()
	p, err := big.Acquire(bctx, 4)
	if err != nil {
		t.Fatalf("Acquire(4) among a stream of Acquire(1): %v (%d small grants)", err, taken.Load())
	}
	_ = p.Release(ctx)
}

// waitSemQueued waits until the semaphore's queue in Redis holds n waiters.
func waitSemQueued(t *testing.T, b *testutil.Backend, s *mutex.Semaphore, n int64) {
	t.Helper()
	rc := b.Client(t)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got, err := rc.ZCard(context.Background(), mutex.SemKey(s, "sem:queue")).Result()
		if err == nil && got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d waiters, want %d (%v)", got, n, err)
		}
	}
}

// TestSemaphoreDeadHeadWaiter: the head waiter stops polling (its process
// died); once its wait lease (3 retry intervals: 150 ms here) ends, a
// release passes it over and grants the live waiter behind it.
func TestSemaphoreDeadHeadWaiter(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	s := mustSem(t, newLocker(t, b), "dead", 1)
	holder, err := s.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := mutex.SemEnqueue(ctx, s, 1)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	wctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	go func() {
		p, err := s.Acquire(wctx, 1)
		if err == nil {
			err = p.Release(ctx)
		}
		got <- err
	}()
	waitSemQueued(t, b, s, 2)
	time.Sleep(500 * time.Millisecond) // past the dead waiter's wait lease
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter behind a dead head: %v", err)
	}
	if score, held := semHolds(t, b.Client(t), s, dead); held {
		t.Errorf("the dead waiter was granted its permit (lease end %v)", score)
	}
}

// TestSemaphoreCancelWakesNext: a queued Acquire(2) blocks an Acquire(1)
// behind it (FIFO) although one permit is free; cancelling it takes it out
// of the queue and grants the next waiter in the same script, which wakes
// on the grant's message long before its next poll (a retry interval of
// 10 s and a lease of a minute: it polls every 10 to 20 s).
func TestSemaphoreCancelWakesNext(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	slow := mutex.WithRetryInterval(10 * time.Second)
	s := mustSem(t, newLocker(t, b, slow), "cancel", 2)
	holder, err := s.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	bctx, bcancel := context.WithCancel(ctx)
	bigErr := make(chan error, 1)
	go func() {
		_, err := s.Acquire(bctx, 2)
		bigErr <- err
	}()
	waitSemQueued(t, b, s, 1)
	if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, mutex.ErrNoPermits) {
		t.Fatalf("TryAcquire(1) with 1 free behind a queued Acquire(2): %v, want ErrNoPermits (no jumping the queue)", err)
	}
	next := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		p, err := s.Acquire(c, 1, mutex.WithTTL(time.Minute))
		if err == nil {
			err = p.Release(ctx)
		}
		next <- err
	}()
	waitSemQueued(t, b, s, 2)
	time.Sleep(100 * time.Millisecond) // the waiter's subscription is made
	start := time.Now()
	bcancel()
	if err := <-bigErr; !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v, want ErrNotObtained and context.Canceled", err)
	}
	if err := <-next; err != nil {
		t.Fatalf("the waiter behind a cancelled one: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the next waiter got its permit %v after the cancellation: not woken by it", d)
	}
}

// TestSemaphoreAcquireHungServer: a queued Acquire whose server hangs
// (CLIENT PAUSE of scripts, on a server of the test's own) returns soon
// after its deadline, although its cancellation cannot reach Redis.
func TestSemaphoreAcquireHungServer(t *testing.T) {
	srv := testutil.StartServer(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s := mustSem(t, mustNew(t, c, mutex.WithPrefix(testutil.NewPrefix())), "hung", 1)
	if _, err := s.TryAcquire(ctx, 1); err != nil { // held until the server goes
		t.Fatal(err)
	}
	done := make(chan time.Duration, 1)
	go func() {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		start := time.Now()
		_, err := s.Acquire(actx, 1)
		if !errors.Is(err, mutex.ErrNotObtained) {
			t.Errorf("Acquire on a hung server: %v, want ErrNotObtained", err)
		}
		done <- time.Since(start)
	}()
	time.Sleep(300 * time.Millisecond) // queued and waiting
	testutil.PauseClients(t, srv.Client(t), 5*time.Second, "WRITE")
	if d := <-done; d > 1800*time.Millisecond {
		t.Errorf("Acquire with a 1 s deadline returned after %v on a hung server", d)
	}
}
