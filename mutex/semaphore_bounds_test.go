package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// TestSemaphoreSizesExact fills a semaphore of each size at and around
// 2^53, where Lua's doubles stop counting by one, and near MaxInt64: a size
// the API accepts grants exactly size permits, never one more, on both
// backends; a size it cannot keep exact is refused with ErrInvalid. Before
// the bound, a semaphore of 2^53 granted 2^53 + 2 (held stayed at 2^53:
// the +1s were lost), and MaxInt64 stored size -2^63 and broke the name.
func TestSemaphoreSizesExact(t *testing.T) {
	const max = mutex.MaxSemaphoreSize
	if max != 1<<53-1 {
		t.Fatalf("MaxSemaphoreSize = %d, want 2^53 - 1", int64(max))
	}
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b)
		for _, size := range []int64{max - 1, max} {
			s := mustSem(t, l, fmt.Sprint("big", size), size)
			// The whole size but one in one weight, then the last permit,
			// then nothing more.
			big, err := s.TryAcquire(ctx, size-1)
			if err != nil {
				t.Fatalf("size %d: TryAcquire(%d): %v", size, size-1, err)
			}
			last, err := s.TryAcquire(ctx, 1)
			if err != nil {
				t.Fatalf("size %d: TryAcquire(1) with 1 free: %v", size, err)
			}
			for i := range 2 {
				if p, err := s.TryAcquire(ctx, 1); !errors.Is(err, mutex.ErrNoPermits) {
					t.Fatalf("size %d full: TryAcquire(1) #%d: %v, %v; want ErrNoPermits", size, i+1, p, err)
				}
			}
			if err := last.Release(ctx); err != nil {
				t.Fatalf("size %d: Release(1): %v", size, err)
			}
			// One free again: exactly one unit fits, not two.
			if _, err := s.TryAcquire(ctx, 2); !errors.Is(err, mutex.ErrNoPermits) {
				t.Fatalf("size %d with 1 free: TryAcquire(2): %v, want ErrNoPermits", size, err)
			}
			if err := big.Release(ctx); err != nil {
				t.Fatalf("size %d: Release(%d): %v", size, size-1, err)
			}
			// The whole size in one weight, and the name still works.
			all, err := s.TryAcquire(ctx, size)
			if err != nil {
				t.Fatalf("size %d: TryAcquire(all): %v", size, err)
			}
			if p, err := s.TryAcquire(ctx, 1); !errors.Is(err, mutex.ErrNoPermits) {
				t.Fatalf("size %d all held: TryAcquire(1): %v, %v; want ErrNoPermits", size, p, err)
			}
			if err := all.Release(ctx); err != nil {
				t.Fatalf("size %d: Release(all): %v", size, err)
			}
			if p, err := s.TryAcquire(ctx, 1); err != nil {
				t.Fatalf("size %d after the releases: TryAcquire(1): %v", size, err)
			} else {
				_ = p.Release(ctx)
			}
		}
		for _, size := range []int64{max + 1, 1 << 53, 1<<53 + 1, 1 << 62, math.MaxInt64 - 1, math.MaxInt64} {
			if _, err := l.Semaphore("big", size); !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("Semaphore of size %d: %v, want ErrInvalid", size, err)
			}
		}
		s := mustSem(t, l, "w", max)
		for _, n := range []int64{max + 1, 1 << 53, 1<<53 + 1, 1 << 62, math.MaxInt64} {
			if _, err := s.TryAcquire(ctx, n); !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("TryAcquire(%d) of %d: %v, want ErrInvalid", n, int64(max), err)
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			if _, err := s.Acquire(cctx, n); !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("Acquire(%d) of %d: %v, want ErrInvalid", n, int64(max), err)
			}
			cancel()
		}
	})
}

// TestSemaphoreQueuedLargeWeights queues waiters whose weights add up past
// 2^53 behind a holder: a release grants exactly what fits, as counted in
// the script's pump (n > size - held, which cannot round).
func TestSemaphoreQueuedLargeWeights(t *testing.T) {
	const max = mutex.MaxSemaphoreSize
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		l := newLocker(t, b)
		s := mustSem(t, l, "q", max)
		head, err := s.TryAcquire(ctx, max)
		if err != nil {
			t.Fatalf("TryAcquire(all): %v", err)
		}
		type got struct {
			p   *mutex.Permit
			err error
		}
		first, second := make(chan got, 1), make(chan got, 1)
		queue := b.Prefix + "{q}:sem:queue"
		go func() { p, err := s.Acquire(ctx, max-1); first <- got{p, err} }()
		waitWaiters(t, ctx, b, queue, 1)
		go func() { p, err := s.Acquire(ctx, 2); second <- got{p, err} }()
		waitWaiters(t, ctx, b, queue, 2)
		if err := head.Release(ctx); err != nil {
			t.Fatalf("Release(all): %v", err)
		}
		g := <-first
		if g.err != nil {
			t.Fatalf("Acquire(2^53 - 2): %v", g.err)
		}
		// 1 left: the waiter for 2 must not get in, however it is counted.
		select {
		case g2 := <-second:
			t.Fatalf("Acquire(2) with 1 free: %v, %v; want it to wait", g2.p, g2.err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := g.p.Release(ctx); err != nil {
			t.Fatalf("Release(2^53 - 2): %v", err)
		}
		g2 := <-second
		if g2.err != nil {
			t.Fatalf("Acquire(2) after the release: %v", g2.err)
		}
		_ = g2.p.Release(ctx)
	})
}

// waitWaiters waits until the semaphore's queue (its key) holds n waiters.
func waitWaiters(t *testing.T, ctx context.Context, b *testutil.Backend, queue string, n int64) {
	t.Helper()
	c := b.Client(t)
	for c.ZCard(ctx, queue).Val() < n {
		if ctx.Err() != nil {
			t.Fatalf("waiting for %d waiters in %s: %v", n, queue, ctx.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLeaseBounds: a lease or retry interval over MaxTTL is refused with
// ErrInvalid wherever one is given (it used to be accepted up to MaxInt64,
// and a semaphore's keys then kept a TTL of 133,439 days after release).
func TestLeaseBounds(t *testing.T) {
	b := testutil.Mini(t)
	ctx := context.Background()
	for _, d := range []time.Duration{mutex.MaxTTL + time.Millisecond, math.MaxInt64} {
		if _, err := mutex.New(b.Client(t), mutex.WithTTL(d)); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("WithTTL(%v): %v, want ErrInvalid", d, err)
		}
		if _, err := mutex.New(b.Client(t), mutex.WithRetryInterval(d)); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("WithRetryInterval(%v): %v, want ErrInvalid", d, err)
		}
		l := newLocker(t, b)
		if _, err := l.TryLock(ctx, "x", mutex.WithTTL(d)); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("TryLock with WithTTL(%v): %v, want ErrInvalid", d, err)
		}
		s := mustSem(t, l, "s", 2)
		if _, err := s.TryAcquire(ctx, 1, mutex.WithTTL(d)); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("TryAcquire with WithTTL(%v): %v, want ErrInvalid", d, err)
		}
		lk, err := l.TryLock(ctx, "y")
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Extend(ctx, d); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("Lock.Extend(%v): %v, want ErrInvalid", d, err)
		}
		p, err := s.TryAcquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Extend(ctx, d); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("Permit.Extend(%v): %v, want ErrInvalid", d, err)
		}
		// Refused before anything: both are still held and release.
		if err := lk.Unlock(ctx); err != nil {
			t.Errorf("Unlock after a refused Extend: %v", err)
		}
		if err := p.Release(ctx); err != nil {
			t.Errorf("Release after a refused Extend: %v", err)
		}
	}
	l := newLocker(t, b)
	if lk, err := l.TryLock(ctx, "max", mutex.WithTTL(mutex.MaxTTL)); err != nil {
		t.Errorf("TryLock with WithTTL(MaxTTL): %v", err)
	} else {
		_ = lk.Unlock(ctx)
	}
}

// TestSemaphoreLongLeaseKeysShrink: a semaphore released after the longest
// lease keeps its keys only as long as its release records need, not for
// the lease's length.
func TestSemaphoreLongLeaseKeysShrink(t *testing.T) {
	// Two ways a release finds the semaphore idle: its script's fast path
	// (nothing due to sweep), and its general path, here because another
	// holder's short lease ended before the release and is swept by it.
	for _, swept := range []bool{false, true} {
		t.Run(fmt.Sprintf("swept=%v", swept), func(t *testing.T) {
			testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
				longLeaseShrinks(t, b, swept)
			})
		})
	}
}

func longLeaseShrinks(t *testing.T, b *testutil.Backend, swept bool) {
	ctx := context.Background()
	c := b.Client(t)
	prefix := testutil.NewPrefix()
	l, err := mutex.New(c, mutex.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	s := mustSem(t, l, "long", 3)
	p, err := s.TryAcquire(ctx, 1, mutex.WithTTL(mutex.MaxTTL))
	if err != nil {
		t.Fatal(err)
	}
	if swept {
		if _, err := s.TryAcquire(ctx, 1, mutex.WithTTL(20*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // its lease ends; the release sweeps it
	}
	key := prefix + "{long}:sem"
	if ttl := c.PTTL(ctx, key).Val(); ttl < mutex.MaxTTL {
		t.Fatalf("TTL while held for a day: %v, want at least the lease", ttl)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{key, prefix + "{long}:sem:ends"} {
		ttl := c.PTTL(ctx, k).Val()
		if ttl <= 0 || ttl > time.Minute {
			t.Errorf("TTL of %s after the release: %v, want at most a minute", k, ttl)
		}
	}
}

// TestSemaphoreShrinkKeepsRecords: the expiry an idle release pulls back
// still covers every record the ends set keeps, not only the release's
// own: a record of 10 s, then a release whose record lasts 1 ms after a
// long lease, leaves the keys at least until the 10 s record ends. (Pulled
// back to the release's own record, the keys expired 10 s too early:
// TestSemaphoreKeysCoverEntries found it under -race in a CI run.)
func TestSemaphoreShrinkKeepsRecords(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b)
		s := mustSem(t, l, "keep", 2)
		long, ok, err := mutex.SemTake(ctx, s, 1, 10*time.Second)
		if err != nil || !ok {
			t.Fatalf("SemTake: %v, %v", ok, err)
		}
		if _, err := mutex.SemReleaseFor(ctx, s, long, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		day, ok, err := mutex.SemTake(ctx, s, 1, mutex.MaxTTL)
		if err != nil || !ok {
			t.Fatalf("SemTake: %v, %v", ok, err)
		}
		if _, err := mutex.SemReleaseFor(ctx, s, day, time.Millisecond); err != nil {
			t.Fatal(err)
		}
		c := b.Client(t)
		for _, kind := range []string{"sem", "sem:ends"} {
			ttl := c.PTTL(ctx, mutex.SemKey(s, kind)).Val()
			if ttl < 9*time.Second || ttl > time.Minute {
				t.Errorf("TTL of %s after the releases: %v, want the 10 s record's end (and a quarter), not the day's lease", kind, ttl)
			}
		}
	})
}

// TestSemaphoreOtherLayoutRefused: a semaphore whose hash an earlier version
// wrote (its scalars in another shape, until its keys expire) is an error
// for every call, not a wrong count: TryAcquire, Acquire and a Release of
// a token fail with Redis's error, and nothing is written.
func TestSemaphoreOtherLayoutRefused(t *testing.T) {
	// The layouts of earlier versions: before issue 45's three keys
	// ("<size>:<fence>:<seq>:<due>:<dd>:<exp>", a field per count), and the
	// nine scalars as text before they were a JSON array.
	for _, old := range []struct{ name, held, m string }{
		{"five keys", "1", "3:17:0:0:0:0"},
		{"text scalars", "", "1:0:0:3:1765000000000:0:1765000030000:0:1765000037500"},
	} {
		t.Run(old.name, func(t *testing.T) {
			testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
				ctx := context.Background()
				c := b.Client(t)
				s := mustSem(t, newLocker(t, b), "old", 3)
				hash := mutex.SemKey(s, "sem")
				fields := []any{"m", old.m}
				if old.held != "" {
					fields = append(fields, "held", old.held)
				}
				if err := c.HSet(ctx, hash, fields...).Err(); err != nil {
					t.Fatal(err)
				}
				if _, err := s.TryAcquire(ctx, 1); err == nil || !strings.Contains(err.Error(), "another layout") {
					t.Errorf("TryAcquire on another layout: %v, want Redis's error", err)
				}
				actx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				if _, err := s.Acquire(actx, 1); err == nil || !strings.Contains(err.Error(), "another layout") {
					t.Errorf("Acquire on another layout: %v, want Redis's error", err)
				}
				if _, err := mutex.SemRelease(ctx, s, "0123456789abcdef0123456789abcdef"); err == nil || !strings.Contains(err.Error(), "another layout") {
					t.Errorf("a release on another layout: %v, want Redis's error", err)
				}
				if got := c.HGet(ctx, hash, "m").Val(); got != old.m {
					t.Errorf("the scalars became %q", got)
				}
			})
		})
	}
}
