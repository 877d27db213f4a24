package otelguard_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/mutex"
	"github.com/funnelguard/funnelguard/otelguard"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func (e *env) locker(t *testing.T) *mutex.Locker {
	t.Helper()
	l, err := mutex.New(e.client, mutex.WithPrefix("otelguard-test:"))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waitBehind runs acquire, which must wait for a holder, in a goroutine:
// once its span has started it checks that acquire still waits after a
// while, and only then runs release. It returns the least time acquire can
// have waited: from when its span was seen started, which is after the
// wrapper took its start time, to release, before which it cannot return.
func (e *env) waitBehind(t *testing.T, span string, acquire func() error, release func() error) time.Duration {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- acquire() }()
	e.waitStarted(t, span)
	t0 := time.Now()
	select {
	case err := <-done:
		t.Fatalf("the second call returned (%v) while the first held", err)
	case <-time.After(50 * time.Millisecond):
	}
	least := time.Since(t0)
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the waiting call: %v", err)
	}
	return least
}

// checkWait checks the wait span and the one point of histogram name: the
// outcome ok, and a wait of at least least in both.
func (e *env) checkWait(t *testing.T, span sdktrace.ReadOnlySpan, name string, least time.Duration) {
	t.Helper()
	a := spanAttrs(span)
	wait, err := strconv.ParseFloat(a["funnelguard.wait"], 64)
	if err != nil || wait < least.Seconds() || a["funnelguard.outcome"] != "ok" || span.Status().Code == codes.Error {
		t.Errorf("span attributes %v, status %v; want outcome ok and a wait of at least %v", a, span.Status(), least)
	}
	pts := histogram(t, e.collect(t), name)
	if len(pts) != 1 || pts[0].Count != 1 {
		t.Fatalf("%s: %d series, want one point", name, len(pts))
	}
	if got := attrs(pts[0].Attributes)["funnelguard.outcome"]; got != "ok" || pts[0].Sum < least.Seconds() {
		t.Errorf("%s: outcome %q, sum %vs; want ok, at least %v", name, got, pts[0].Sum, least)
	}
}

// A Lock that waits for another holder records its wait, at least as long
// as the holder kept the lock after the wait began, with the outcome ok;
// the Redis commands of its attempts are children of its span.
func TestLockWaitRecorded(t *testing.T) {
	e := newEnv(t)
	tr := e.tracer(t)
	ctx := context.Background()
	// The holder's commands go under a span of the test's.
	hctx, hspan := e.tp.Tracer("test").Start(ctx, "holder")
	holder, err := e.locker(t).Lock(hctx, phone)
	if err != nil {
		t.Fatal(err)
	}
	var lk *mutex.Lock
	least := e.waitBehind(t, otelguard.SpanLock,
		func() (err error) { lk, err = tr.Lock(ctx, e.locker(t), phone); return err },
		func() error { return holder.Unlock(hctx) })
	hspan.End()
	if err := lk.Unlock(hctx); err != nil {
		t.Fatal(err)
	}

	span := e.spanNamed(t, otelguard.SpanLock)
	e.checkWait(t, span, otelguard.MetricLockWait, least)
	n := children(t, e.spans.Ended(), []sdktrace.ReadOnlySpan{span, e.spanNamed(t, "holder")})
	if n[span.SpanContext().SpanID()] == 0 {
		t.Errorf("no Redis command under the lock span")
	}
}

// An Acquire that waits for a holder's permit records its wait likewise.
func TestSemaphoreWaitRecorded(t *testing.T) {
	e := newEnv(t)
	tr := e.tracer(t)
	ctx := context.Background()
	sem := func() *mutex.Semaphore {
		s, err := e.locker(t).Semaphore(phone, 2)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	holder, err := sem().Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	var p *mutex.Permit
	least := e.waitBehind(t, otelguard.SpanAcquire,
		func() (err error) { p, err = tr.Acquire(ctx, sem(), 1); return err },
		func() error { return holder.Release(ctx) })
	defer p.Release(ctx)

	span := e.spanNamed(t, otelguard.SpanAcquire)
	e.checkWait(t, span, otelguard.MetricSemaphoreWait, least)
	if a := spanAttrs(span); a["funnelguard.n"] != "1" || a["funnelguard.semaphore.size"] != "2" {
		t.Errorf("span attributes %v, want n 1 and size 2", a)
	}
}

// A Lock whose context ends while another holds the lock: the outcome
// not_obtained, an error span, and the wait recorded all the same.
func TestLockNotObtained(t *testing.T) {
	e := newEnv(t)
	tr := e.tracer(t)
	ctx := context.Background()
	holder, err := e.locker(t).Lock(ctx, phone)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock(ctx)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := tr.Lock(short, e.locker(t), phone); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("Lock: %v, want ErrNotObtained", err)
	}

	span := e.spanNamed(t, otelguard.SpanLock)
	if a := spanAttrs(span); a["funnelguard.outcome"] != "not_obtained" || a["error.type"] != "not_obtained" ||
		span.Status().Code != codes.Error {
		t.Errorf("span attributes %v, status %v", a, span.Status())
	}
	pts := histogram(t, e.collect(t), otelguard.MetricLockWait)
	if len(pts) != 1 || attrs(pts[0].Attributes)["funnelguard.outcome"] != "not_obtained" {
		t.Errorf("wait points %v, want one not_obtained", pts)
	}
}
