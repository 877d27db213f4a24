package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// TestPermitRenewAndLoss: with WithAutoRenew a permit of a 600 ms lease is
// still held after 2.4 s (Done open, its permits not free); without it the
// permit is lost: Done closes, Context's cause is ErrLockLost, Extend and
// Release return ErrNotHeld. Release ends a renewed permit with cause
// ErrNotHeld.
func TestPermitRenewAndLoss(t *testing.T) {
	ctx := context.Background()
	s := mustSem(t, newLocker(t, testutil.RealBackend(t)), "renew", 2)
	lease := 600 * time.Millisecond
	kept, err := s.TryAcquire(ctx, 1, mutex.WithTTL(lease), mutex.WithAutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	gone, err := s.TryAcquire(ctx, 1, mutex.WithTTL(lease))
	if err != nil {
		t.Fatal(err)
	}
	keptCtx, goneCtx := kept.Context(ctx), gone.Context(ctx)
	select {
	case <-goneCtx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a permit whose lease ended: its Context is not cancelled")
	}
	if cause := context.Cause(goneCtx); !errors.Is(cause, mutex.ErrLockLost) {
		t.Errorf("lost permit's Context cause: %v, want ErrLockLost", cause)
	}
	time.Sleep(4 * lease)
	select {
	case <-kept.Done():
		t.Fatal("a renewed permit was lost")
	default:
	}
	if _, err := s.TryAcquire(ctx, 2); !errors.Is(err, mutex.ErrNoPermits) {
		t.Errorf("TryAcquire(2) while a renewed permit holds 1: %v, want ErrNoPermits", err)
	}
	if err := gone.Extend(ctx, time.Second); !errors.Is(err, mutex.ErrNotHeld) {
		t.Errorf("Extend of a lost permit: %v, want ErrNotHeld", err)
	}
	if err := gone.Release(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Errorf("Release of a lost permit: %v, want ErrNotHeld", err)
	}
	if err := kept.Extend(ctx, 2*time.Second); err != nil {
		t.Errorf("Extend of a held permit: %v", err)
	}
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-keptCtx.Done(): // cancelled by a context.AfterFunc: soon, not at once
	case <-time.After(5 * time.Second):
		t.Fatal("a released permit's Context is not cancelled")
	}
	if cause := context.Cause(keptCtx); !errors.Is(cause, mutex.ErrNotHeld) {
		t.Errorf("released permit's Context cause: %v, want ErrNotHeld", cause)
	}
}
