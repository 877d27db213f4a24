package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// TestNilContext: every call given a nil context answers ErrNilContext
// (ErrInvalid) before it changes anything: after Release(nil) the permit is
// still held and Release(ctx) gives it back (it used to panic halfway and
// leave the permit taken until its lease ended, Release answering
// ErrNotHeld); after Unlock(nil) the lock still unlocks; a TryLock or a
// TryAcquire with nil takes nothing.
func TestNilContext(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		var nilCtx context.Context // a variable: vet would flag a literal nil
		ctx := context.Background()
		l := newLocker(t, b)
		s := mustSem(t, l, "nil-sem", 1)
		check := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, mutex.ErrNilContext) || !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("%s with a nil context: %v, want ErrNilContext (ErrInvalid)", what, err)
			}
		}
		_, err := l.TryLock(nilCtx, "nil-lock")
		check("TryLock", err)
		_, err = l.Lock(nilCtx, "nil-lock")
		check("Lock", err)
		call := mutex.Call{Fragment: mutex.NewFragment("return 1")}
		_, _, err = l.TryLockWith(nilCtx, "nil-lock", call)
		check("TryLockWith", err)
		_, _, err = l.LockWith(nilCtx, "nil-lock", call)
		check("LockWith", err)
		_, err = s.TryAcquire(nilCtx, 1)
		check("TryAcquire", err)
		_, err = s.Acquire(nilCtx, 1)
		check("Acquire", err)

		lk, err := l.TryLock(ctx, "nil-lock") // nothing was taken above
		if err != nil {
			t.Fatalf("TryLock after the nil calls: %v", err)
		}
		p, err := s.TryAcquire(ctx, 1)
		if err != nil {
			t.Fatalf("TryAcquire after the nil calls: %v", err)
		}
		check("Lock.Extend", lk.Extend(nilCtx, time.Minute))
		_, err = lk.TTL(nilCtx)
		check("Lock.TTL", err)
		_, err = lk.Run(nilCtx, call)
		check("Lock.Run", err)
		check("Lock.Unlock", lk.Unlock(nilCtx))
		_, err = lk.UnlockWith(nilCtx, call)
		check("Lock.UnlockWith", err)
		check("Permit.Extend", p.Extend(nilCtx, time.Minute))
		check("Permit.Release", p.Release(nilCtx))

		// Nothing changed: both are still held, and end now.
		select {
		case <-lk.Done():
			t.Error("Lock ended by the nil calls")
		case <-p.Done():
			t.Error("Permit ended by the nil calls")
		default:
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Errorf("Unlock after Unlock(nil): %v, want nil", err)
		}
		if err := p.Release(ctx); err != nil {
			t.Errorf("Release after Release(nil): %v, want nil", err)
		}
		if p2, err := s.TryAcquire(ctx, 1); err != nil {
			t.Errorf("TryAcquire after the release: %v", err)
		} else {
			_ = p2.Release(ctx)
		}
	})
}
