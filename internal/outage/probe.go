package outage

import (
	"context"
	"time"

	"github.com/funnelguard/funnelguard/internal/reach"
)

// A probe is one dial of a Watch; err and refused are set when done is
// closed.
type probe struct {
	began   time.Time
	done    chan struct{}
	err     error
	refused bool
}

// start begins a probe with ctx's values; w.mu is held.
func (w *Watch) start(ctx context.Context) *probe {
	p := &probe{began: time.Now(), done: make(chan struct{})}
	w.flight, w.seen = p, p.began
	go w.run(context.WithoutCancel(ctx), p)
	return p
}

// run dials once, bounded by w.bound rather than by the call that started
// it (other calls wait for it too), closes the connection and records the
// outcome: only a refusal makes w down, and only a dial that connects makes
// it up again (opening a detour, see Detour). A dial that fails otherwise (a
// time-out) changes nothing: a hung server is no refusal, and a refusing
// server whose refusal came late (a starved process, whose dial ran out of
// its time before it ran) is not back.
func (w *Watch) run(ctx context.Context, p *probe) {
	ctx, cancel := context.WithTimeout(ctx, w.bound)
	defer cancel()
	conn, err := w.dial(ctx)
	if conn != nil {
		_ = conn.Close()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	p.err, p.refused = err, err != nil && reach.Unreachable(err)
	w.flight = nil
	switch {
	case p.refused:
		w.err = err
		w.down.Store(true)
	case err == nil && w.down.Load():
		w.down.Store(false)
		w.ups.Add(1)
		w.detour.Store(time.Now().Add(Detour).UnixNano())
	}
	close(p.done)
}

// wait waits for p or for the end of ctx (ok false); err is p's refusal,
// or nil.
func (p *probe) wait(ctx context.Context) (err error, ok bool) {
	select {
	case <-p.done:
		return p.result(), true
	case <-ctx.Done():
		return nil, false
	}
}

// result is the refusal of p, which has ended, or nil.
func (p *probe) result() error {
	if p.refused {
		return refused(p.err)
	}
	return nil
}

// check tells a running call whether the server refuses now: from what a
// probe or a call saw less than Every ago, else from a new probe (one at a time: others
// wait for it). An end of ctx before the answer is no refusal.
func (w *Watch) check(ctx context.Context) error {
	w.mu.Lock()
	p := w.flight
	if p == nil {
		if time.Since(w.seen) < Every { // a probe's or a call's, still fresh
			down, err := w.down.Load(), w.err
			w.mu.Unlock()
			if down {
				return refused(err)
			}
			return nil
		}
		p = w.start(ctx)
	}
	w.mu.Unlock()
	err, _ := p.wait(ctx)
	return err
}
