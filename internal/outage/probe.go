package outage

import (
	"context"
	"time"

	"github.com/funnelguard/funnelguard/internal/reach"
)

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
