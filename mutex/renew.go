package mutex

import (
	"context"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
)

// A renewal is the goroutine that keeps an WithAutoRenew lease alive (a lock's
// or a Permit's); a life starts and stops it (lease.go).
type renewal struct {
	stop    chan struct{} // closed to end the goroutine
	stopped bool          // guarded by life.mu
	done    chan struct{} // closed when the goroutine has returned
}

func (r *renewal) stopLocked() {
	if !r.stopped {
		r.stopped = true
		close(r.stop)
	}
}

// A renewer is what renewLoop keeps alive: a lock's hold or a semaphore's
// Permit.
type renewer interface {
	// renewOnce extends the lease once, and records the new lease when
	// Redis reports it held; held false with a nil error means it is gone.
	renewOnce(ctx context.Context, lease time.Duration) (held bool, err error)
	// lose ends it as lost: taken or gone, never re-acquired.
	lose()
}

// renewOnce is the hold's renewer step: one extend script.
func (h *hold) renewOnce(ctx context.Context, lease time.Duration) (bool, error) {
	start := time.Now()
	held, err := h.locker.dep.extend(ctx, h, "", lease, start)
	if err == nil && held {
		h.setDeadline(leaseEnd(start, lease))
	}
	return held, err
}

// renewLoop extends x's lease every lease/3 until r is stopped or x is lost.
func renewLoop(x renewer, r *renewal, lease time.Duration) {
	defer close(r.done)
	period := max(lease/3, time.Millisecond)
	t := time.NewTimer(period)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		// One attempt may take at most a period, so a slow Redis delays the
		// next attempt but never hides the deadline.
		ctx, cancel := ctxcall.DeadlineOnly(context.Background(), time.Now().Add(period))
		held, err := x.renewOnce(ctx, lease)
		cancel()
		if err == nil && !held {
			x.lose() // taken or gone: never re-acquire
			return
		}
		// On an error keep trying each period; the deadline timer ends the
		// lock or permit if no renewal lands before the lease must have ended.
		t.Reset(period)
	}
}
