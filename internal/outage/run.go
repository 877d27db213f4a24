package outage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// Run runs f, a call to the watched server, with ctx bounded by d (only by
// d and a cut when ctx cannot end: ctxcall.DeadlineOnly). While w saw a
// refusal the call may end at once with it (admit); while f runs, w checks
// every Every, and a refusal cuts f's context and is returned instead of
// f's error, unless ctx ended. f's own unreachable error (not a closed
// client) makes w down. A refusal matches reach.ErrUnreachable.
func (w *Watch) Run(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	cctx, cancel := ctxcall.DeadlineOnly(ctx, time.Now().Add(d))
	defer cancel()
	if w == nil {
		return f(cctx)
	}
	ups, err := w.admit(cctx)
	if err != nil {
		return err
	}
	c := &call{w: w, ctx: cctx, cancel: cancel}
	c.mu.Lock()
	c.t = time.AfterFunc(Every, c.fire)
	c.mu.Unlock()
	err = f(cctx)
	cut := c.end()
	switch {
	case err == nil:
		return nil
	case cut != nil && ctx.Err() == nil:
		return cut
	case reach.Unreachable(err) && !errors.Is(err, redis.ErrClosed):
		w.saw(err, ups)
	}
	return err
}

// A call is one Run's f while it runs: a timer checks w every Every.
type call struct {
	w      *Watch
	ctx    context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	t     *time.Timer
	ended bool
	cut   error // the refusal that cancelled ctx
}

// fire checks w; unless the call ended meanwhile, a refusal cancels it,
// and else the timer is set for the next check.
func (c *call) fire() {
	err := c.w.check(c.ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.ended:
	case err != nil:
		c.cut = err
		c.cancel()
	default:
		c.t.Reset(Every)
	}
}

// end stops the checks and returns the refusal that cut the call, or nil.
func (c *call) end() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = true
	c.t.Stop()
	return c.cut
}

// refused returns err, a refusal, as the error of a call a Watch ended.
func refused(err error) error {
	return fmt.Errorf("redis refuses connections: %w", reach.Mark(err))
}
