package funnel

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
)

// The concurrent admissions of one key with one rule set in one Limiter
// form a batch, decided in arrival order on one read and written in one
// script by the call that leads it (DESIGN.md, "Hot keys"). AllowN opens
// the batches and leads them (allow.go); this file is the rest of a batch:
// its calls that wait and what each is answered when its leader fails (a
// leader its gate admitted carries them on: carryOn, gate.go).

// A waiter is one call in a batch.
type waiter struct {
	n        int64
	done     chan struct{} // closed once res, err or again is set; nil for the leader
	deadline time.Time     // the call's context's (zero: none)
	until    int64         // once admitted: when (server µs) its write is refused; MaxInt64: never
	res      Result
	err      error
	again    bool        // not decided, for a reason of its leader's: it runs again
	gone     atomic.Bool // its caller left: nothing is decided for it
}

func (ws sealed) failLeader(err error) {
	ws[0].err = err
	ws[1:].rerunAll()
}

func (ws sealed) rerunAll() {
	for _, w := range ws {
		w.again = true
	}
}

func (ws sealed) failAll(err error) {
	for _, w := range ws {
		w.err = err
	}
}

// giveUp answers the calls of a batch out of attempts ErrConflict; if the
// last write came late (a clock sample that keeps coming late), those with
// a deadline errLate: out of time, not a conflict.
func (ws sealed) giveUp(late bool) {
	for _, w := range ws {
		w.err = ErrConflict
		if late && !w.deadline.IsZero() {
			w.err = errLate
		}
	}
}

// failAdmitted answers the admitted calls with err: their write may or may
// not have run. A denial stands: it took nothing.
func (ws sealed) failAdmitted(err error) {
	for _, w := range ws {
		if w.res.Allowed {
			w.err, w.res = err, Result{}
		}
	}
}

// late answers errLate the admitted calls out of time after a write refused
// as late (nothing was written). If the leader's is one, the others run
// again; else the rest of the batch is decided again: late returns ws.
func (ws sealed) late() sealed {
	for i, w := range ws {
		if !w.res.Allowed || !outOfTime(w.deadline) {
			continue
		}
		w.res, w.err = Result{}, errLate
		if i == 0 {
			ws.failLeader(errLate)
			return nil
		}
		w.gone.Store(true) // not decided again
	}
	return ws
}

// maxReruns bounds how often a call runs again because its leader ran out
// of time; then it leads alone. A rerun is no lost commit: it never ends in
// ErrConflict.
const maxReruns = 8

// wait waits until w's batch decided it or ctx ends: then w leaves its batch
// and wait returns ctx's error, unless the batch decided w meanwhile. again
// reports that w was not decided, for a reason of its leader's, and has
// time left to run again.
func (w *waiter) wait(ctx context.Context) (Result, bool, error) {
	select {
	case <-w.done:
	case <-ctx.Done():
		w.gone.Store(true)
		select {
		case <-w.done:
		default:
			return Result{}, false, ctx.Err()
		}
	}
	switch {
	case !w.again:
		return w.res, false, w.err
	case ctx.Err() != nil:
		return Result{}, false, ctx.Err()
	case outOfTime(w.deadline): // no time left for a write of its own
		return Result{}, false, errLate
	}
	return Result{}, true, nil
}

// failed answers the calls ws after the attempt failed with err. Only the
// end of the leader's own time is its alone: then the others run again.
// Any other error is what they would hear too: they get it.
func (l *leader) failed(ctx context.Context, ws sealed, err error) {
	err = corrupt(err)
	switch {
	case errors.Is(err, ErrUnreachable) || !ranOutOfTime(ctx, err):
		ws.failAll(err)
	case ws[0].done != nil: // carried on (carryOn): the leader's own call is decided
		ws.rerunAll()
	default:
		ws.failLeader(err)
	}
}

// ranOutOfTime reports whether err may come from the end of ctx's time:
// ctx ended, or a time-out (a client's with ContextTimeoutEnabled).
func ranOutOfTime(ctx context.Context, err error) bool {
	return ctxcall.Ended(ctx) != nil || errors.Is(err, context.Canceled) || ctxcall.TimedOut(err)
}
