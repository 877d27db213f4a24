package mutex

import (
	"context"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
)

// unlockTimeout bounds an Unlock whose context has no deadline or has ended.
const unlockTimeout = 2 * time.Second

// opErr wraps err, if not nil, with the operation and the name it acted on:
// an Unlock's, and every other call's on a lock or a semaphore.
func opErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("mutex: %s %q: %w", op, name, err)
}

// Unlock releases the lock, or returns ErrNotHeld. ctx's deadline bounds it;
// its cancellation does not. After a Redis error the handle stays held: call
// Unlock again.
func (lk *Lock) Unlock(ctx context.Context) error {
	_, err := lk.release(ctx, nil)
	return err
}

// UnlockWith runs call.Fragment and releases the lock in one script, only if
// this handle still holds it, and returns the fragment's result, or
// ErrNotHeld (not run). After a Redis error call it again: a repeat reports
// the first run's result (ErrResultUnknown for a table), or runs the
// fragment if it had not.
func (lk *Lock) UnlockWith(ctx context.Context, call Call) (any, error) {
	return lk.release(ctx, &call)
}

// A handOff is the next owner a release names (nh nil for none). A release
// of unknown outcome keeps its handOff as the handle's unsure, with start,
// when it was sent (the hand-over's lease began after): the handle's next
// release makes the very same call, so that the first one's record answers.
type handOff struct {
	nh    *hold
	pass  passing
	lease time.Duration
	start time.Time
}

// A release is one Unlock or UnlockWith that won the move to releasing.
type release struct {
	lk      *Lock
	h       *hold
	l       *Locker
	call    *Call    // the fragment to run; nil for Unlock
	again   *handOff // the unsure release this one repeats, if any
	last    bool     // lk was the hold's last open handle when the release began
	next    *waiter  // the local waiter the lock goes to, if any
	handOff          // how, and that waiter's hold when it goes through Redis
	// foreign: nh is a token this release repeats but no longer owns (an
	// attempt took it to adopt the lock): handed to no waiter, never released.
	foreign bool
}

func (lk *Lock) release(ctx context.Context, call *Call) (any, error) {
	switch {
	case ctx == nil:
		return nil, ErrNilContext
	case call != nil:
		if err := call.check(lk.dep()); err != nil {
			return nil, err
		}
	}
	if lk == nil {
		return nil, ErrNotHeld
	}
	again, last, err := lk.beginRelease()
	if err != nil {
		return nil, err
	}
	r := release{lk: lk, h: lk.hold, l: lk.hold.locker, call: call, again: again, last: last}
	if last {
		r.h.stopRenew() // no renewal runs after Unlock returns
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	res, err := r.l.dep.release(ctx, &r)
	if err != nil {
		lk.hold.abortRelease(&lk.lifeSignal) // a no-op once the handle has ended
	}
	return res, err
}

// pickWaiter chooses the next owner: a local waiter, or a repeated
// release's first choice, which goes through Redis (the lock may be gone).
func (r *release) pickWaiter() {
	switch {
	case r.again != nil && r.again.nh != nil:
		r.handOff = *r.again
	case r.again == nil && r.l.nqueues.Load() != 0: // no lock taken when none waits
		if r.next, r.pass = r.l.nextWaiter(r.h.name, r.call == nil); r.next != nil {
			r.nh, r.lease = newHold(r.l, r.h.name, r.l.names(r.h.name)), r.next.cfg.ttl
		}
	}
}

// released tells the head of name's queue, if any, to try at once.
func (l *Locker) released(name string) {
	if l.nqueues.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wakeHeadLocked(name)
}

// release hands over locally if it may, else goes through releaseSafely.
func (single) release(ctx context.Context, r *release) (any, error) {
	if r.last {
		r.pickWaiter()
	}
	if r.handOverLocally() {
		return nil, nil
	}
	return r.l.releaseSafely(ctx, r)
}

// roundTrip sends the release under st: unlock.lua when plain, else
// release.lua. failed is the error that left the handle held.
func (r *release) roundTrip(ctx context.Context, st stamp, late func(any, error)) (res any, err, failed error) {
	if r.again != nil && r.nh != nil && !r.foreign {
		r.next, _ = r.l.nextWaiter(r.h.name, r.call == nil) // the waiter now first in line
	}
	if r.plain() {
		if done, failed := r.unlockPlain(ctx, st); done {
			return nil, opErr("unlock", r.h.name, failed), failed
		}
	}
	return r.script(ctx, st, late)
}

// handOverLocally passes the lock to the next local waiter without a round
// trip: never for a fragment (it must run in Redis) or with fencing (each
// holder needs its own number).
func (r *release) handOverLocally() bool {
	if r.next == nil || r.pass != passLocal || r.call != nil || r.l.fenceTTL != 0 {
		return false
	}
	nlk := r.h.passOn(r.lk, r.next.cfg)
	if nlk == nil {
		return false
	}
	r.l.handedOver(r.h.name, r.next, nlk)
	return true
}

// plain reports the release unlock.lua serves: the last handle, the root,
// no fragment, no hand-over, no fencing.
func (r *release) plain() bool {
	return r.call == nil && r.nh == nil && r.last && r.lk.id == 0 && r.l.fenceTTL == 0
}

// unlockPlain runs unlock.lua; if !done, release.lua decides under st.
func (r *release) unlockPlain(ctx context.Context, st stamp) (done bool, err error) {
	h, l := r.h, r.l
	reply, err := l.run(ctx, unlockScript, []string{h.key, h.nkey, h.tkey}, st.unlockArgs(h.valueArg, h.token), nil)
	switch {
	case err != nil:
		r.lk.unsureOf(err, handOff{}, time.Time{})
		return true, err
	case reply == any(int64(0)):
		l.scripted.Store(true)
		h.release(r.lk, true)
		l.released(h.name)
		return true, nil
	}
	return false, nil
}

func (r *release) script(ctx context.Context, st stamp, late func(any, error)) (any, error, error) {
	start := time.Now()
	if r.again != nil && r.again.nh != nil {
		start = r.again.start // the hand-over may date from then
	}
	reply, short, err := r.send(ctx, st, late)
	var n [3]int64
	var rest []any
	if err == nil {
		r.l.scripted.Store(true)
		n, rest, err = ints(reply, 2)
	}
	switch {
	case err != nil:
		r.cancelHandOver()
		r.lk.unsureOf(err, r.handOff, start)
		return nil, opErr("unlock", r.h.name, err), err
	case n[0] < 0:
		r.cancelHandOver()
		r.h.end(r.h, lost)
		return nil, ErrNotHeld, nil
	}
	rest = r.yield(rest)
	short = r.settle(ctx, n[0], n[1], start, short)
	res, err := r.result(rest, short)
	return res, err, nil
}

// send sends release.lua, with WAIT only for a hand-over or a fragment;
// short reports too few replicas acknowledging.
func (r *release) send(ctx context.Context, st stamp, late func(any, error)) (reply any, short, err error) {
	h, l := r.h, r.l
	script := releaseScript
	if r.call != nil {
		script = r.call.Fragment.release
	}
	nextToken, nextLease := any(""), any(0)
	if r.nh != nil {
		nextToken, nextLease = r.nh.token, r.lease.Milliseconds()
		if r.pass == passUnlessMarked {
			nextToken = unlessMarked + r.nh.token
		}
	}
	owner, sseq, smark := st.releaseArgs()
	keys, args := scriptCall(r.call, &h.names, true, h.token, argID(r.lk.id), nextToken, nextLease, l.fenceMS, owner, sseq, smark)
	return l.runWithAck(ctx, script, keys, args, false, r.nh == nil && r.call == nil, late)
}

// settle ends the handle after Redis released it and completes or cancels
// the hand-over, returning the replicas' shortfall still to report.
func (r *release) settle(ctx context.Context, left, fence int64, start time.Time, short error) error {
	r.h.release(r.lk, left == 0)
	if r.foreign {
		r.nh = nil // another's now: neither undone nor released here
	}
	// Handed over on the master alone: undone; the waiter tries again.
	undo := left == 0 && short != nil && r.nh != nil
	if undo && r.call == nil {
		short = nil // the release itself stands, and needs no replica
	}
	switch {
	case left != 0:
		r.cancelHandOver() // Redis still counts open handles
	case r.next != nil && !undo:
		nh, nlk := r.nh, &Lock{hold: r.nh}
		nh.fence = fence
		nh.add(nlk, start, r.lease)
		r.l.handedOver(r.h.name, r.next, nlk)
	default:
		if r.nh != nil {
			// Undone, or handed to nh by an earlier run for a waiter that has gone.
			r.l.releaseRoot(ctx, r.nh)
		}
		r.cancelHandOver()
		r.l.released(r.h.name)
	}
	return short
}

// unlessMarked prefixes the next owner's token for a hand-over that yields
// to a marked lock (passUnlessMarked); yielded is the reply's third element
// when it did. Neither is a hex digit.
const (
	unlessMarked = "?"
	yielded      = "y"
)

// yield handles a hand-over that yielded to a marked lock: the waiter
// waits again.
func (r *release) yield(rest []any) []any {
	if r.call != nil || len(rest) == 0 || rest[0] != any(yielded) {
		return rest
	}
	if r.next != nil {
		r.l.yielded(r.next)
	}
	r.next, r.nh = nil, nil
	return rest[1:]
}

func (r *release) cancelHandOver() {
	if r.next != nil {
		r.l.handedOver(r.h.name, r.next, nil)
		r.next = nil
	}
}

// result is the fragment's result, ErrResultUnknown for a replayed table,
// and the replicas' shortfall.
func (r *release) result(rest []any, short error) (any, error) {
	if len(rest) > 1 && rest[1] == any(int64(2)) && r.call != nil {
		return nil, ErrResultUnknown
	}
	return resultOf(rest), opErr("unlock", r.h.name, short)
}

func (lk *Lock) unsureOf(err error, next handOff, start time.Time) {
	if !unknownOutcome(err) {
		return
	}
	lk.hold.mu.Lock()
	defer lk.hold.mu.Unlock()
	if lk.unsure == nil {
		next.start = start
		lk.unsure = &next
	}
}

const dropWait = 100 * time.Millisecond

func (lk *Lock) drop() {
	waitAtMost(dropWait, func() {
		ctx, cancel := ctxcall.DeadlineOnly(context.Background(), time.Now().Add(unlockTimeout))
		defer cancel()
		_ = lk.Unlock(ctx)
	})
}

// waitAtMost runs release in a goroutine and waits for it d at most, so a
// caller that gave up returns near its deadline on a hung server too.
func waitAtMost(d time.Duration, release func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		release()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// detach returns ctx without its cancellation but with its deadline, or
// with unlockTimeout when ctx has none or has ended.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Done() == nil {
		return ctx, func() {}
	}
	// A deadline that has passed has ended ctx, though its timer may not
	// have fired yet (a loaded machine): the release would fail at once and
	// leave the lock for its lease.
	d, ok := ctx.Deadline()
	if !ok || ctxcall.Ended(ctx) != nil {
		d = time.Now().Add(unlockTimeout)
	}
	return ctxcall.DeadlineOnly(context.WithoutCancel(ctx), d)
}
