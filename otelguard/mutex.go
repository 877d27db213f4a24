package otelguard

import (
	"context"
	"time"

	"github.com/funnelguard/funnelguard/mutex"
)

// Lock is l.Lock(ctx, name, opts...) in a span named SpanLock, whose
// context the Redis commands of the acquisition get; the span ends when
// Lock returns, not when the lock is released. It records the wait in
// MetricLockWait and in the span (AttrWait) with its outcome: "ok",
// "not_obtained" when ctx ended first, "error" otherwise. The name is not
// recorded (see WithKeyAttributes).
func (t *Tracer) Lock(ctx context.Context, l *mutex.Locker, name string, opts ...mutex.Option) (*mutex.Lock, error) {
	if ctx == nil { // refused by the Locker before anything else
		return l.Lock(ctx, name, opts...)
	}
	start := time.Now()
	ctx, span := t.start(ctx, SpanLock, name)
	lk, err := l.Lock(ctx, name, opts...)
	t.endWait(ctx, span, t.lockWait, start, err)
	return lk, err
}

// Acquire is s.Acquire(ctx, n, opts...) in a span named SpanAcquire, whose
// context the Redis commands of the acquisition get; the span ends when
// Acquire returns. It records the wait in MetricSemaphoreWait and in the
// span, with its outcome as Lock does, and n and the semaphore's size; not
// its name.
func (t *Tracer) Acquire(ctx context.Context, s *mutex.Semaphore, n int64, opts ...mutex.Option) (*mutex.Permit, error) {
	if ctx == nil {
		return s.Acquire(ctx, n, opts...)
	}
	start := time.Now()
	ctx, span := t.start(ctx, SpanAcquire, s.Name(), AttrN.Int64(n), AttrSize.Int64(s.Size()))
	p, err := s.Acquire(ctx, n, opts...)
	t.endWait(ctx, span, t.semWait, start, err)
	return p, err
}
