package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/mutex"
	"github.com/hibiken/asynq/x/rate"
)

// semSize is the number of permits of the semaphore cases' one name.
const semSize = 4

// Subjects of the semaphore cases. goadesign/pulse's semaphore, the issue's
// reference, is missing: its module is not served by the module proxy here
// (README.md).
const (
	libAsynq     = "asynq"
	libAsynq1ms  = "asynq, 1 ms retry"
	libAsynq10ms = "asynq, 10 ms retry"
)

// semCases time a semaphore of semSize permits on one name: TryAcquire +
// Release by one goroutine, and Acquire(1) + Release by every goroutine
// (ops = acquisitions). asynq's semaphore has no blocking acquire, so its
// contenders retry its TryAcquire-style Acquire after a fixed sleep.
func semCases(goroutines int) []benchCase {
	tasks := &asynqTasks{} // shared by the cases: made once per run
	return append([]benchCase{
		// Uncontended: the libraries take turns within each round, as the
		// uncontended lock cycles do (interleave.go): a serial cycle's rate
		// follows the loopback's latency, which moved this case's ratio by
		// 0.06 between two runs of whole rounds of the same code ten minutes
		// apart (issue 45: 0.75x and 0.81x).
		{name: "Semaphore acquire+release uncontended serial", ref: libAsynq, serverCmds: true, turns: true, subjects: []subject{
			{libFunnelguard, funnelguardSem(false)},
			{libAsynq, asynqSem(tasks, 0)},
			{libNoDeadline, semNoDeadline()},
			{handedOffName(libAsynq), handedOff(asynqSem(tasks, 0))},
		}},
		{name: fmt.Sprintf("Semaphore contended, N=%d, %d goroutines", semSize, goroutines), parallel: true,
			ref: libAsynq1ms, serverCmds: true, subjects: []subject{
				{libFunnelguard, funnelguardSem(true)},
				{libAsynq1ms, asynqSem(tasks, time.Millisecond)},
				{libAsynq10ms, asynqSem(tasks, 10*time.Millisecond)},
			}},
	}, handoffCase())
}

// funnelguardSem: one Locker (default settings) and its Semaphore on the
// round's name; uncontended, one goroutine's TryAcquire(1) + Release;
// contended, every goroutine's Acquire(1) + Release.
func funnelguardSem(contended bool) func(context.Context, *env) (workload, error) {
	return func(_ context.Context, e *env) (workload, error) {
		l, err := mutex.New(e.client(), mutex.WithPrefix(e.prefix))
		if err != nil {
			return workload{}, err
		}
		s, err := l.Semaphore("sem", semSize)
		if err != nil {
			return workload{}, err
		}
		take, n := s.TryAcquire, 1
		if contended {
			take, n = s.Acquire, e.goroutines
		}
		return workload{goroutines: n, op: func(ctx context.Context, _, _ int) error {
			p, err := take(ctx, 1)
			if errors.Is(err, mutex.ErrNotObtained) {
				return errGaveUp
			}
			if err != nil {
				return err
			}
			return p.Release(context.WithoutCancel(ctx)) // as the lock cases: no deadline on a release
		}}, nil
	}
}

// semNoDeadline is funnelguardSem's uncontended cycle with a context that
// cannot end (context.WithoutCancel of the round's): TryAcquire runs in the
// caller's goroutine, with no hand-off (what the hand-off costs).
func semNoDeadline() func(context.Context, *env) (workload, error) {
	mk := funnelguardSem(false)
	return func(ctx context.Context, e *env) (workload, error) {
		w, err := mk(ctx, e)
		op := w.op
		w.op = func(ctx context.Context, g, i int) error { return op(context.WithoutCancel(ctx), g, i) }
		return w, err
	}
}

// asynqSem: rate.NewSemaphore on the round's scope, used as its example has
// it (Acquire in a task handler's context, whose task ID names the holder
// and whose deadline ends the holding; Release with the same context): each
// goroutine has a task context of its own (asynqTasks) and the round's
// deadline. retry 0: one goroutine, an Acquire that is refused fails the
// round; otherwise every goroutine retries a refused Acquire after sleeping
// retry, until the round ends (then it gave up).
func asynqSem(tasks *asynqTasks, retry time.Duration) func(context.Context, *env) (workload, error) {
	return func(ctx context.Context, e *env) (workload, error) {
		n := 1
		if retry > 0 {
			n = e.goroutines
		}
		e.client() // the env's first client: server stats and clean-up
		ids, err := tasks.get(ctx, e, n)
		if err != nil {
			return workload{}, err
		}
		sem := rate.NewSemaphore(asynqConn{e}, e.prefix+"sem", semSize)
		cache := make([]*taskCtx, n) // per goroutine: the round's context with its task's values
		return workload{goroutines: n, op: func(ctx context.Context, g, _ int) error {
			if cache[g] == nil || cache[g].Context != ctx {
				cache[g] = &taskCtx{Context: ctx, task: ids[g]}
			}
			tctx := cache[g]
			for {
				ok, err := sem.Acquire(tctx)
				switch {
				case err != nil:
					return err
				case ok:
					return sem.Release(context.WithoutCancel(tctx))
				case retry == 0:
					return errors.New("asynq: uncontended Acquire refused")
				}
				select {
				case <-ctx.Done():
					return errGaveUp
				case <-time.After(retry):
				}
			}
		}}, nil
	}
}
