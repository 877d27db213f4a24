package mutex_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testmust"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

func mustSem(t testing.TB, l *mutex.Locker, name string, size int64) *mutex.Semaphore {
	t.Helper()
	return testmust.Semaphore(t, l, name, size)
}

// TestSemaphoreTryAcquire counts permits on both backends: what fits is
// granted, what does not is ErrNoPermits, a release gives permits back,
// and bad input is ErrInvalid.
func TestSemaphoreTryAcquire(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b)
		s := mustSem(t, l, "pool", 3)
		p2, err := s.TryAcquire(ctx, 2)
		if err != nil {
			t.Fatalf("TryAcquire(2) of 3: %v", err)
		}
		if _, err := s.TryAcquire(ctx, 2); !errors.Is(err, mutex.ErrNoPermits) {
			t.Fatalf("TryAcquire(2) with 1 free: %v, want ErrNoPermits", err)
		}
		p1, err := s.TryAcquire(ctx, 1)
		if err != nil {
			t.Fatalf("TryAcquire(1) with 1 free: %v", err)
		}
		if p1.Fence() <= p2.Fence() {
			t.Errorf("fences %d then %d: want increasing", p2.Fence(), p1.Fence())
		}
		if err := p2.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := p2.Release(ctx); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("second Release: %v, want ErrNotHeld", err)
		}
		if p, err := s.TryAcquire(ctx, 2); err != nil {
			t.Fatalf("TryAcquire(2) after the release: %v", err)
		} else {
			_ = p.Release(ctx)
		}
		other := mustSem(t, l, "pool", 4)
		if _, err := other.TryAcquire(ctx, 1); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("TryAcquire under another size: %v, want ErrInvalid", err)
		}
		for _, n := range []int64{0, -1, 4} {
			if _, err := s.TryAcquire(ctx, n); !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("TryAcquire(%d) of 3: %v, want ErrInvalid", n, err)
			}
		}
		_ = p1.Release(ctx)
	})
}

func TestSemaphoreBadInput(t *testing.T) {
	l := newLocker(t, testutil.Mini(t))
	for _, c := range []struct {
		name string
		size int64
	}{{"", 1}, {"x", 0}, {"x", -5}} {
		if _, err := l.Semaphore(c.name, c.size); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("Semaphore(%q, %d): %v, want ErrInvalid", c.name, c.size, err)
		}
	}
	var nilPermit *mutex.Permit
	if err := nilPermit.Release(context.Background()); !errors.Is(err, mutex.ErrNotHeld) {
		t.Errorf("nil Permit Release: %v", err)
	}
	for _, kind := range []string{"sem", "sem:queue"} {
		if _, err := l.Key("x", kind); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("Key(x, %q): %v, want ErrInvalid", kind, err)
		}
	}
}

// TestSemaphoreRacingRelease races Releases of one Permit: exactly one
// returns nil.
func TestSemaphoreRacingRelease(t *testing.T) {
	ctx := context.Background()
	s := mustSem(t, newLocker(t, testutil.RealBackend(t)), "race", 2)
	for range 20 {
		p, err := s.TryAcquire(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for range 16 {
			wg.Go(func() {
				if p.Release(ctx) == nil {
					mu.Lock()
					wins++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if wins != 1 {
			t.Fatalf("%d of 16 racing Releases returned nil, want 1", wins)
		}
	}
}

// TestSemaphoreLeaseEnds: a holder that never releases (it crashed) gives
// its permits back when its lease ends, and its Done closes by then.
func TestSemaphoreLeaseEnds(t *testing.T) {
	ctx := context.Background()
	s := mustSem(t, newLocker(t, testutil.RealBackend(t)), "crash", 2)
	lease := 300 * time.Millisecond
	start := time.Now()
	dead, err := s.TryAcquire(ctx, 2, mutex.WithTTL(lease))
	if err != nil {
		t.Fatal(err)
	}
	deadDone := dead.Done()
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := s.Acquire(actx, 1)
	if err != nil {
		t.Fatalf("Acquire after a holder's lease: %v", err)
	}
	if waited := time.Since(start); waited < lease {
		t.Errorf("granted after %v, before the crashed holder's lease of %v ended", waited, lease)
	}
	select {
	case <-deadDone:
	case <-time.After(2 * time.Second):
		t.Errorf("the expired permit's Done is open while its permits went to another")
	}
	if err := dead.Release(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Errorf("Release of an expired permit: %v, want ErrNotHeld", err)
	}
	_ = p.Release(ctx)
}

// TestSemaphoreWaiterGetsReleasedPermits: on both backends, with and
// without notifications, an Acquire queued behind a full semaphore gets the
// permits a release gives back.
func TestSemaphoreWaiterGetsReleasedPermits(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		for _, opts := range [][]mutex.Option{nil, {mutex.WithoutNotifications()}} {
			ctx := context.Background()
			s := mustSem(t, newLocker(t, b, opts...), "wait", 2)
			p, err := s.TryAcquire(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				c, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				q, err := s.Acquire(c, 2)
				if err == nil {
					err = q.Release(ctx)
				}
				got <- err
			}()
			waitSemQueued(t, b, s, 1)
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("waiter (options %d): %v", len(opts), err)
			}
		}
	})
}
