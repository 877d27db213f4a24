package mutex_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// failRelease is a go-redis hook that fails every semaphore_release.lua
// call (4 arguments) without sending it, after waiting until wait returns;
// sent counts those calls.
type failRelease struct {
	wait func()
	sent atomic.Int64
}

var errInjected = errors.New("injected: the release never reached Redis")

func (h *failRelease) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if len(testutil.ScriptArgs(cmd)) == 4 {
			h.sent.Add(1)
			h.wait()
			cmd.SetErr(errInjected)
			return errInjected
		}
		return next(ctx, cmd)
	}
}

func (h *failRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestPermitLostDuringFailedRelease: a Permit whose lease passes while its
// Release is under way ends as lost (Done closes); when that Release then
// fails, the Permit stays ended: a second Release answers ErrNotHeld at
// once, without a command, as Lock.Unlock does. A Release that put the
// Permit back to held whatever happened meanwhile sent a second release
// for a Permit whose Done had closed.
func TestPermitLostDuringFailedRelease(t *testing.T) {
	b := testutil.Mini(t)
	ctx := context.Background()
	var p *mutex.Permit
	hook := &failRelease{}
	hook.wait = func() {
		select {
		case <-p.Done(): // the lease's timer ended it as lost
		case <-time.After(10 * time.Second):
			t.Error("the Permit's Done did not close after its lease")
		}
	}
	c := b.Client(t)
	c.AddHook(hook)
	s := mustSem(t, mustNew(t, c, mutex.WithPrefix(b.Prefix)), "lapse", 1)
	var err error
	if p, err = s.TryAcquire(ctx, 1, mutex.WithTTL(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); !errors.Is(err, errInjected) {
		t.Fatalf("the failed Release: %v, want the injected error", err)
	}
	if err := p.Release(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Errorf("a Release after the Permit was lost: %v, want ErrNotHeld", err)
	}
	if n := hook.sent.Load(); n != 1 {
		t.Errorf("%d releases sent, want 1: the lost Permit's second Release went to Redis", n)
	}
	if _, ok := p.Deadline(); ok {
		t.Error("Deadline ok after the Permit was lost")
	}
}
