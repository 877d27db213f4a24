package funnel

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Batched admissions: the concurrent AllowN calls of one Limiter for one key
// and one set of rules share a lock hold. The first call leads: it takes the
// lock and reads the state; the calls that arrive meanwhile join its batch;
// when the state comes back the batch is sealed, every call in it is
// decided in arrival order on that state (each all or nothing, each seeing
// the units the calls before it took), and the leader writes the result and
// releases the lock in one script. Calls arriving after the seal form the
// next batch, whose leader waits for the lock. A hot key thus costs two
// round trips per batch instead of per call, and its decisions are those of
// the calls run one after another at the server time of the read.

// A waiter is one call in a batch.
type waiter struct {
	n    int64
	done chan struct{} // closed when res, err or again are set; nil for the leader
	// deadline is the call's context's (zero: none); until, once the call
	// is admitted, the server time from which its write is refused
	// (serverclock.go; noDeadline: never).
	deadline time.Time
	until    int64
	res      Result
	err      error
	// again: the batch failed for a reason of its leader's (its context
	// ended): the call was not decided and runs again.
	again bool
	// gone: the caller's context ended and it left; the batch decides
	// nothing for it.
	gone atomic.Bool
}

// batchKey identifies the calls that can share a lock hold.
type batchKey struct {
	key string
	set *ruleSet
}

// A batch is the calls waiting for one lock hold, in arrival order. It
// holds its leader's waiter and the first slot of waiters, so that a call
// that leads alone (most) allocates once.
type batch struct {
	waiters []*waiter
	first   [1]*waiter
	leader  waiter
}

// batches holds the open batch of each key.
type batches struct {
	mu   sync.Mutex
	open map[batchKey]*batch
}

// join adds a call of n units with deadline d to the open batch of k, or
// opens one with it as its leader, and returns the call's waiter.
func (bs *batches) join(k batchKey, n int64, d time.Time) (*batch, *waiter, bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b := bs.open[k]; b != nil {
		w := &waiter{n: n, deadline: d, done: make(chan struct{})}
		b.waiters = append(b.waiters, w)
		return b, w, false
	}
	if bs.open == nil {
		bs.open = make(map[batchKey]*batch)
	}
	b := newBatch(n, d)
	bs.open[k] = b
	return b, &b.leader, true
}

// newBatch returns a batch of one call, its leader's, of n units with
// deadline d.
func newBatch(n int64, d time.Time) *batch {
	b := &batch{leader: waiter{n: n, deadline: d}}
	b.first[0] = &b.leader
	b.waiters = b.first[:]
	return b
}

// seal closes b to new calls and returns its calls. A batch of a zero key
// was never open (WithoutBatching).
func (bs *batches) seal(k batchKey, b *batch) sealed {
	if k.key == "" {
		return b.waiters
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.open[k] == b {
		delete(bs.open, k)
	}
	return b.waiters
}

// sealed is the calls of a batch closed to new ones, the leader's first.
type sealed []*waiter

// rerunOthers makes every call but the first run again, undecided.
func (ws sealed) rerunOthers() {
	for _, w := range ws[1:] {
		w.again = true
	}
}

// rerunAll makes every call run again, undecided.
func (ws sealed) rerunAll() {
	for _, w := range ws {
		w.again = true
	}
}

// failAll answers every call with err.
func (ws sealed) failAll(err error) {
	for _, w := range ws {
		w.err = err
	}
}

// failLate answers the calls errLate, but those without a deadline (which
// a late write never refused) ErrConflict.
func (ws sealed) failLate() {
	for _, w := range ws {
		w.err = errLate
		if w.deadline.IsZero() {
			w.err = ErrConflict
		}
	}
}

// failAdmitted answers the admitted calls with err.
func (ws sealed) failAdmitted(err error) {
	for _, w := range ws {
		if w.res.Allowed {
			w.err, w.res = err, Result{}
		}
	}
}

// deadline is the server time from which the write of the admitted calls
// of ws is refused: the earliest of theirs (noDeadline when none has one).
func (ws sealed) deadline() int64 {
	d := noDeadline
	for _, w := range ws {
		if w.res.Allowed && w.err == nil && w.until != noDeadline && (d == noDeadline || w.until < d) {
			d = w.until
		}
	}
	return d
}

// late handles a write refused as past the deadline of one of the admitted
// calls ws (nothing was written): each admitted call out of time is
// answered errLate, and takes nothing. If the leader is, the others run
// again; else the batch, but those, is decided again (again is true), on a
// fresh read whose clock bounds the next write (a server clock that
// stepped forward refuses one write, not the calls).
func (ws sealed) late() (again bool) {
	for i, w := range ws {
		if !w.res.Allowed || !outOfTime(w.deadline) {
			continue
		}
		w.res, w.err = Result{}, errLate
		if i == 0 {
			ws.rerunOthers()
			return false
		}
		w.gone.Store(true) // not decided again
	}
	return true
}

// wake hands every call but the leader's own its outcome.
func (ws sealed) wake() {
	for _, w := range ws {
		if w.done != nil { // not the leader's own call
			close(w.done)
		}
	}
}

// maxReruns bounds how many times a call runs again because the leader of
// its batch ran out of its own time (its context ended, or no time was
// left for its write): then it leads a batch of its own. A rerun is no
// lost commit (those are lead's to count), so it never ends in
// ErrConflict: on a Redis that does not answer, leaders that end one after
// another would make a call with time left fail as if it had lost races.
const maxReruns = 8

// allowBatched is AllowN's path with batching: it joins or leads a batch and
// returns the call's outcome.
func (lim *Limiter) allowBatched(ctx context.Context, c call, n int64) (Result, error) {
	k := batchKey{c.key, c.set}
	d, _ := ctx.Deadline()
	for range maxReruns {
		b, w, lead := lim.batches.join(k, n, d)
		if lead {
			lim.lead(ctx, c, k, b, n)
		} else if err := w.wait(ctx); err != nil {
			return Result{}, err
		}
		if !w.again {
			return outcome(ctx, w.res, w.err)
		}
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		if outOfTime(d) {
			// Run again (its leader's write came late, say) with no time
			// left for a write of its own: it would be refused.
			return outcome(ctx, Result{}, errLate)
		}
	}
	// Its leaders kept running out of time before it: it leads alone,
	// under its own context, and nobody else's end can send it round.
	return lim.allowAlone(ctx, c, n)
}

// wait waits until w's batch has decided it, or ctx ends: then w leaves its
// batch and wait returns ctx's error, unless the batch decided w meanwhile
// (the outcome stands).
func (w *waiter) wait(ctx context.Context) error {
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
	}
	w.gone.Store(true)
	select {
	case <-w.done:
		return nil
	default:
		return ctx.Err()
	}
}
