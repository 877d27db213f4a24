package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/mutex"
)

// The hand-off cases' Locker and permits: with a retry interval of 30 s a
// queued waiter's wait lease is 90 s and it polls every 30-60 s (see
// Semaphore.Acquire), so no poll falls within a round shorter than that:
// a round's scripts are releases and the re-queueing of the released.
const (
	handoffRetry = 30 * time.Second
	handoffLease = 10 * time.Minute
)

// handoffCase: one permit (N=1) and W goroutines on one name, each looping
// Acquire(1) + Release, so that about W Acquire calls are always queued;
// W = 10, 100 and 1000 are the case's subjects (alternating, as libraries
// do). A round is timed from the holder's first Release, once every waiter
// is queued. ops = acquisitions, each a hand-off: one release script that
// grants the head waiter and announces it (PUBLISH), and the released
// goroutine's Acquire that queues again. Redis work per op should not grow
// with the queue.
func handoffCase() benchCase {
	waiters := map[string]int{}
	var subjects []subject
	for _, w := range []int{10, 100, 1000} {
		lib := fmt.Sprintf("%d waiters", w)
		waiters[lib] = w
		subjects = append(subjects, subject{lib: lib})
	}
	return benchCase{
		name:       "Semaphore hand-off, N=1, W waiters queued",
		parallel:   true, // many goroutines: ×PING is over PING parallel
		serverCmds: true,
		ref:        subjects[0].lib,
		measure: func(ctx context.Context, addr, lib string, d time.Duration) (sample, error) {
			return measureHandoffs(ctx, addr, waiters[lib], d)
		},
		subjects: subjects,
	}
}

// measureHandoffs runs one hand-off round with waiters goroutines queued.
func measureHandoffs(ctx context.Context, addr string, waiters int, d time.Duration) (sample, error) {
	e := newEnv(addr, waiters)
	defer e.close(context.WithoutCancel(ctx))
	c := e.client()
	l, err := mutex.New(c, mutex.WithPrefix(e.prefix), mutex.WithRetryInterval(handoffRetry))
	if err != nil {
		return sample{}, err
	}
	s, err := l.Semaphore("sem", 1)
	if err != nil {
		return sample{}, err
	}
	holder, err := s.TryAcquire(ctx, 1, mutex.WithTTL(handoffLease))
	if err != nil {
		return sample{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var acquired atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, waiters)
	for range waiters {
		wg.Go(func() { errs <- handoffLoop(rctx, s, &acquired) })
	}
	out, err := timeHandoffs(ctx, e, holder, &acquired, waiters, d)
	cancel()
	wg.Wait()
	close(errs)
	for e := range errs {
		if err == nil {
			err = e
		}
	}
	return out, err
}

// timeHandoffs waits until waiters Acquire calls are queued, then releases
// holder and samples the round for d.
func timeHandoffs(ctx context.Context, e *env, holder *mutex.Permit, acquired *atomic.Int64, waiters int, d time.Duration) (sample, error) {
	if err := waitQueued(ctx, e, int64(waiters)); err != nil {
		return sample{}, err
	}
	c := e.clients[0]
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cmds0, server0, start := e.cmds(), readServerStats(ctx, c), time.Now()
	if err := holder.Release(ctx); err != nil {
		return sample{}, err
	}
	select {
	case <-ctx.Done():
		return sample{}, ctx.Err()
	case <-time.After(d):
	}
	ops, elapsed, cmds := acquired.Load(), time.Since(start), e.cmds()-cmds0
	runtime.ReadMemStats(&after)
	server := readServerStats(ctx, c).minus(server0)
	if ops == 0 {
		return sample{}, fmt.Errorf("no hand-off in %v", d)
	}
	return sample{ops: ops, elapsed: elapsed, mallocs: after.Mallocs - before.Mallocs, cmds: cmds, server: server}, nil
}

// handoffLoop acquires and releases s's permit until ctx ends, counting the
// acquisitions.
func handoffLoop(ctx context.Context, s *mutex.Semaphore, acquired *atomic.Int64) error {
	for {
		p, err := s.Acquire(ctx, 1, mutex.WithTTL(handoffLease))
		switch {
		case err != nil && ctx.Err() != nil:
			return nil // the round is over: Acquire left the queue
		case err != nil:
			return err
		}
		acquired.Add(1)
		if err := p.Release(context.WithoutCancel(ctx)); err != nil {
			return err
		}
	}
}

// waitQueued waits, up to a minute, until the round's semaphore has n
// waiters queued (its queue key, "<prefix>{sem}:sem:queue", documented by
// mutex.Semaphore).
func waitQueued(ctx context.Context, e *env, n int64) error {
	key := keyspace.Key(e.prefix, "sem", "sem:queue")
	ctx, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	for {
		got, err := e.clients[0].ZCard(ctx, key).Result()
		switch {
		case err != nil:
			return fmt.Errorf("waiting for %d queued Acquire calls (%d): %w", n, got, err)
		case got == n:
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}
