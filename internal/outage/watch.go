package outage

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// Times of a Watch.
const (
	// Retry is the least time between two probes that admit calls while
	// the server refuses: the calls in between fail at once.
	Retry = 20 * time.Millisecond
	// Every is how often a running call checks for a refusal; a probe that
	// began less than Every ago answers for every call.
	Every = 50 * time.Millisecond
	// Detour is how long calls go to another client once the server is
	// back: longer than the second go-redis's dial breaker may stay open.
	Detour = 1100 * time.Millisecond
)

// A Dial connects to the watched server.
type Dial func(ctx context.Context) (net.Conn, error)

// A Watch tells whether the server refuses connections now. It is safe for
// concurrent use. A nil *Watch watches nothing: Run only bounds the call.
type Watch struct {
	dial   Dial
	bound  time.Duration        // a probe's time limit
	down   atomic.Bool          // the last thing seen was a refusal
	ups    atomic.Uint64        // counts the times down was cleared
	detour atomic.Int64         // when the last detour ends (Unix ns)
	spare  func() *redis.Client // Spare's, made once; nil for New

	mu     sync.Mutex
	seen   time.Time // when the last probe began, or a call last saw a refusal
	err    error     // the last refusal, while down
	flight *probe    // the probe under way, or nil
}

// New returns a Watch that probes with dial, each probe bounded by bound
// (and by the dialer's own time-outs).
func New(dial Dial, bound time.Duration) *Watch {
	return &Watch{dial: dial, bound: bound}
}

// For returns a Watch of client, probing with its own dialer (DialOf), or
// nil for a client that is not a *redis.Client: those are not watched.
func For(client any, bound time.Duration) *Watch {
	dial := DialOf(client)
	if dial == nil {
		return nil
	}
	w := New(dial, bound)
	opts := client.(interface{ Options() *redis.Options }).Options()
	w.spare = sync.OnceValue(func() *redis.Client {
		o := *opts // what go-redis's own clones copy
		// No connection of its own, and few kept idle between detours.
		o.MinIdleConns, o.MaxIdleConns = 0, 4
		return redis.NewClient(&o)
	})
	return w
}

// Down reports whether the last thing w saw was a refusal.
func (w *Watch) Down() bool { return w != nil && w.down.Load() }

// Detouring reports whether a call begun now should go to another client
// (Spare): for Detour after the server came back from refusing, while the
// watched client's dial breaker may still refuse it. One atomic load.
func (w *Watch) Detouring() bool {
	return w != nil && time.Now().UnixNano() < w.detour.Load()
}

// Spare returns a client of the watched server for the calls of a detour,
// made at the first call from the watched client's options, with pools of
// its own and none of its hooks; nil for a Watch made by New.
func (w *Watch) Spare() *redis.Client {
	if w == nil || w.spare == nil {
		return nil
	}
	return w.spare()
}

// Run runs f, a call to the watched server, with ctx bounded by d (only by
// d and a cut when ctx cannot end: ctxcall.DeadlineOnly). While w saw a
// refusal the call may end at once with it (admit); while f runs, w checks
// every Every, and a refusal cuts f's context and is returned instead of
// f's error, unless ctx ended. f's own error that Refuses makes w down. A
// refusal matches reach.ErrUnreachable.
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
	case Refuses(err):
		w.saw(err, ups)
	}
	return err
}

// Refuses reports whether err is a refusal: unreachable, not a closed client.
func Refuses(err error) bool {
	return reach.Unreachable(err) && !errors.Is(err, redis.ErrClosed)
}

// admit lets a call go ahead, returning the count of ups it began in, or
// the refusal that ends it at once (see Retry); a call that probes waits
// for the probe, bounded by ctx.
func (w *Watch) admit(ctx context.Context) (uint64, error) {
	ups := w.ups.Load()
	if !w.down.Load() {
		return ups, nil
	}
	w.mu.Lock()
	if w.flight != nil || time.Since(w.seen) < Retry {
		w.mu.Unlock()
		return 0, w.refusal()
	}
	p := w.start(ctx)
	w.mu.Unlock()
	if !p.wait(ctx) {
		return 0, ctx.Err()
	}
	if w.down.Load() { // refused, or neither refused nor connected: not back
		return 0, w.refusal()
	}
	return w.ups.Load(), nil
}

// refusal is the error of a call w ends at once: its last refusal.
func (w *Watch) refusal() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return refused(w.err)
}

// saw records a refusal that a call begun in ups got: w is down, unless
// the server was seen back since the call began.
func (w *Watch) saw(err error, ups uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ups.Load() != ups {
		return
	}
	w.err, w.seen = err, time.Now()
	w.down.Store(true)
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

// A probe is one dial of a Watch; err, its refusal or nil, is set when done
// is closed.
type probe struct {
	done chan struct{}
	err  error
}

// start begins a probe with ctx's values; w.mu is held.
func (w *Watch) start(ctx context.Context) *probe {
	p := &probe{done: make(chan struct{})}
	w.flight, w.seen = p, time.Now()
	go w.run(context.WithoutCancel(ctx), p)
	return p
}

// run dials once, bounded by w.bound rather than by the call that started
// it (other calls wait for it too), and records the outcome as the package
// doc says (a refusing server whose dial was starved of its time is not
// back).
func (w *Watch) run(ctx context.Context, p *probe) {
	ctx, cancel := context.WithTimeout(ctx, w.bound)
	defer cancel()
	conn, err := w.dial(ctx)
	if conn != nil {
		_ = conn.Close()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flight = nil
	switch {
	case reach.Unreachable(err):
		p.err, w.err = refused(err), err
		w.down.Store(true)
	case err == nil && w.down.Load():
		w.down.Store(false)
		w.ups.Add(1)
		w.detour.Store(time.Now().Add(Detour).UnixNano())
	}
	close(p.done)
}

// check tells a running call whether the server refuses now: from what a
// probe or a call saw less than Every ago, else from a new probe (one at a
// time: others wait for it). An end of ctx before the answer is no refusal.
func (w *Watch) check(ctx context.Context) error {
	w.mu.Lock()
	p := w.flight
	if p == nil && time.Since(w.seen) < Every { // a probe's or a call's, still fresh
		defer w.mu.Unlock()
		if w.down.Load() {
			return refused(w.err)
		}
		return nil
	}
	if p == nil {
		p = w.start(ctx)
	}
	w.mu.Unlock()
	if !p.wait(ctx) {
		return nil
	}
	return p.err
}

// wait reports whether p ended before ctx did.
func (p *probe) wait(ctx context.Context) bool {
	select {
	case <-p.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// refused returns err, a refusal, as the error of a call a Watch ended.
func refused(err error) error {
	return fmt.Errorf("redis refuses connections: %w", reach.Mark(err))
}
