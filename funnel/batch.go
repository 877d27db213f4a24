package funnel

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/funnelguard/funnelguard/mutex"
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
	res  Result
	err  error
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

// A batch is the calls waiting for one lock hold, in arrival order.
type batch struct {
	waiters []*waiter
}

// batches holds the open batch of each key.
type batches struct {
	mu   sync.Mutex
	open map[batchKey]*batch
	// onJoin, if set, runs when a call joins a batch (tests).
	onJoin func()
}

// join adds w to the open batch of k, or opens one with w as its leader.
func (bs *batches) join(k batchKey, w *waiter) (*batch, bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b := bs.open[k]; b != nil {
		w.done = make(chan struct{})
		b.waiters = append(b.waiters, w)
		if bs.onJoin != nil {
			bs.onJoin()
		}
		return b, false
	}
	if bs.open == nil {
		bs.open = make(map[batchKey]*batch)
	}
	b := &batch{waiters: []*waiter{w}}
	bs.open[k] = b
	return b, true
}

// seal closes b to new calls and returns its calls. A batch of a zero key
// was never open (WithoutBatching).
func (bs *batches) seal(k batchKey, b *batch) []*waiter {
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

// allowBatched is AllowN's path with batching: it joins or leads a batch and
// returns the call's outcome.
func (lim *Limiter) allowBatched(ctx context.Context, c call, n int64) (Result, error) {
	k := batchKey{c.key, c.set}
	for range maxCommits {
		w := &waiter{n: n}
		b, lead := lim.batches.join(k, w)
		if lead {
			lim.lead(ctx, c, k, b, n)
		} else {
			select {
			case <-w.done:
			case <-ctx.Done():
				w.gone.Store(true)
				// It may have been decided meanwhile: the outcome stands.
				select {
				case <-w.done:
				default:
					return Result{}, ctx.Err()
				}
			}
		}
		if !w.again {
			return w.res, w.err
		}
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
	}
	return Result{}, ErrConflict
}

// lead runs batch b, whose leader asks n units: the lock and the read, the
// decisions of its calls, one write, and each call's outcome. A key with no
// state and a free lock admits the leader's units in the read's round trip
// (admit.lua); the others of the batch then run again.
func (lim *Limiter) lead(ctx context.Context, c call, k batchKey, b *batch, n int64) {
	var ws []*waiter
	defer func() {
		for _, w := range ws[1:] {
			close(w.done)
		}
	}()
	// Before Redis reads its clock: a denial's wait counts from here, for
	// every call of the batch (see denyCache).
	sent, epoch := time.Now(), lim.denials.epoch()
	levels := make([]level, len(c.rules))
	var lock string // the key's lock, for the one-round-trip admission
	if !lim.uniform {
		lock = lim.locker.LockKey(c.name)
	}
	for range maxCommits {
		gate := c.read(readGate)
		switch {
		case lim.penalty != nil:
			gate = mutex.Call{Fragment: penaltyGate, Keys: []string{c.key}, Args: c.penalized(lim.penalty, "1")}
		case !lim.uniform:
			gate = c.admit(n, lock)
		}
		lk, res, err := lim.locker.TryLockWith(ctx, c.name, gate, lim.hold...)
		if errors.Is(err, mutex.ErrLocked) {
			lk, res, err = lim.locker.LockWith(ctx, c.name, gate, lim.hold...)
		}
		if ws == nil {
			ws = lim.batches.seal(k, b)
		}
		declined := errors.Is(err, mutex.ErrDeclined)
		if now, ok := admitted(declined, res); ok {
			// Admitted by the gate, on an empty state: the units of the
			// leader's call alone.
			d := decide(c.rules, make([]level, len(c.rules)), now, n)
			ws[0].res = d.result(c.rules)
			for _, w := range ws[1:] {
				w.again = true
			}
			return
		}
		if err != nil && !declined {
			// The leader's error, perhaps its context's: the others run
			// again, each under its own context.
			ws[0].err = corrupt(err)
			for _, w := range ws[1:] {
				w.again = true
			}
			return
		}
		res, till := lim.unbox(c, res)
		snap, perr := parseRead(c.rules, res)
		if perr != nil {
			_ = lk.Unlock(ctx)
			for _, w := range ws {
				w.err = perr
			}
			return
		}
		copy(levels, snap.levels)
		admitted := 0
		for i, w := range ws {
			if i > 0 && w.gone.Load() {
				continue // its caller left before its turn: nothing taken for it
			}
			d := decide(c.rules, levels, snap.now, w.n)
			if till > 0 { // in the penalty box
				w.res = boxed(d, c.rules, snap.now, till)
				continue
			}
			if declined || !d.allowed {
				d.allowed = false
				d.retry = max(d.retry, 1) // never "retry now" on a denial
				w.res = d.result(c.rules)
				continue
			}
			for j := range levels {
				levels[j] = level{fill: d.fills[j], at: d.ats[j]}
			}
			w.res = d.result(c.rules)
			admitted++
		}
		if admitted == 0 {
			_ = lk.Unlock(ctx) // nil when declined
			lim.cacheDenials(c, ws, sent, epoch)
			return
		}
		if lim.beforeCommit != nil {
			lim.beforeCommit()
		}
		fills, ats := make([]int64, len(levels)), make([]int64, len(levels))
		for j, lv := range levels {
			fills[j], ats[j] = lv.fill, lv.at
		}
		write := mutex.Call{Fragment: writeBack, Keys: []string{c.key}, Args: writeArgs(c.rules, fills, ats, snap.now)}
		_, err = lk.UnlockWith(ctx, write)
		if errors.Is(err, mutex.ErrNotHeld) {
			continue // the lease lapsed: decide every call again on fresh state
		}
		if err != nil {
			// The write may or may not have happened: the admitted calls
			// cannot know; a denial stands (it took nothing).
			for _, w := range ws {
				if w.res.Allowed {
					w.err, w.res = err, Result{}
				}
			}
			return
		}
		lim.cacheDenials(c, ws, sent, epoch)
		return
	}
	for _, w := range ws {
		w.err = ErrConflict
	}
}

// admitted reports whether a declined gate's result says that admit.lua
// admitted the call, and the server time it did.
func admitted(declined bool, res any) (int64, bool) {
	if !declined {
		return 0, false
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != 2 || arr[1] != "admitted" {
		return 0, false
	}
	now, ok := arr[0].(int64)
	return now, ok
}

// cacheDenials remembers the batch's denials in the deny cache.
func (lim *Limiter) cacheDenials(c call, ws []*waiter, sent time.Time, epoch uint64) {
	if lim.denials == nil {
		return
	}
	for _, w := range ws {
		if w.err == nil && !w.res.Allowed && w.res.RetryAfter > 0 {
			lim.denials.store(c.key, c.set, w.n, sent, epoch, w.res)
		}
	}
}
