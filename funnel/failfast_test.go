package funnel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// Fail fast: when the leader of a batch finds Redis unreachable, every call
// of the batch gets its error at once. They used to run again, one leader
// after another, each paying a refusal of its own: 16 calls, 16 refusals in
// a row.
func TestRefusedFailsTheWholeBatch(t *testing.T) {
	const calls = 16
	r := testutil.NewRefused(t, 0)
	release := r.HoldDials(t)
	lim := mustLimiter(t, r.Client(t), funnel.WithPrefix(testutil.NewPrefix()))
	watch := newBatchWatch()
	rule := funnel.Rule{Name: "r", Capacity: 100, Leak: 1, Per: time.Second}
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			_, err := lim.Allow(ctx, "k", rule)
			if !errors.Is(err, funnel.ErrUnreachable) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("call %d: %v after %v; want ErrUnreachable", i, err, time.Since(start))
			}
		})
	}
	awaitJoins(t, watch, calls-1)
	release()
	wg.Wait()
	if n := r.Dials(); n != 1 {
		t.Errorf("%d dials for one batch of %d calls; want the leader's alone", n, calls)
	}
}

// Every call that reaches Redis says when it could not: Peek, Refund and
// Reset too, and on a closed client.
func TestUnreachableEverywhere(t *testing.T) {
	rule := funnel.Rule{Name: "r", Capacity: 100, Leak: 1, Per: time.Second}
	b := testutil.Mini(t)
	closed := b.Client(t)
	closed.Close()
	for name, lim := range map[string]*funnel.Limiter{
		"refused":       mustLimiter(t, testutil.NewRefused(t, 0).Client(t)),
		"closed client": mustLimiter(t, closed, funnel.WithPrefix(b.Prefix)),
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		_, aerr := lim.Allow(ctx, "k", rule)
		_, perr := lim.Peek(ctx, "k", rule)
		rerr := lim.Refund(ctx, "k", 1, rule)
		xerr := lim.Reset(ctx, "k")
		took := time.Since(start)
		cancel()
		for call, err := range map[string]error{"Allow": aerr, "Peek": perr, "Refund": rerr, "Reset": xerr} {
			if !errors.Is(err, funnel.ErrUnreachable) {
				t.Errorf("%s, %s: %v; want ErrUnreachable", name, call, err)
			}
		}
		if took > time.Second {
			t.Errorf("%s: four calls took %v under a 5 s deadline; want each at once", name, took)
		}
	}
}

// A leader's error that is not the end of its own time is the whole
// batch's: 16 calls of a key whose state another program overwrote with a
// string all get ErrCorruptState from the leader's one lock attempt. They
// used to run again, one leader after another, each paying an attempt of
// its own, and those that ran again 8 times ended in ErrConflict.
func TestLeaderErrorFailsTheWholeBatch(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		const calls = 16
		rule := funnel.Rule{Name: "r", Capacity: 100, Leak: 1, Per: time.Second}
		lim, counter, release, watch := heldLimiter(t, b, rule, "hot")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang's bound
		defer cancel()
		if err := b.Client(t).Set(ctx, b.Prefix+"{hot}:f", "not a hash", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		errs := make([]error, calls)
		var wg sync.WaitGroup
		for i := range calls {
			wg.Go(func() { _, errs[i] = lim.Allow(ctx, "hot", rule) })
		}
		awaitJoins(t, watch, calls-1)
		release()
		wg.Wait()
		for i, err := range errs {
			if !errors.Is(err, funnel.ErrCorruptState) {
				t.Errorf("call %d: %v; want ErrCorruptState", i, err)
			}
		}
		if n := counter.N.Load(); n != 1 {
			t.Errorf("%d commands for one batch of %d calls; want the leader's lock attempt alone", n, calls)
		}
	})
}
