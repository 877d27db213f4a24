package funnel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/funnelguard/funnelguard/mutex"
)

// Peek reports what Allow would decide for key now, changing nothing and
// taking no lock: one round trip.
func (lim *Limiter) Peek(ctx context.Context, key string, rules ...Rule) (Result, error) {
	if ctx == nil {
		return Result{}, ErrNilContext
	}
	c, err := lim.prepare(key, rules)
	if err != nil {
		return Result{}, err
	}
	script, args := readPeek, c.ids
	if lim.penalty != nil {
		script, args = penaltyPeek, c.penalized(lim.penalty, "0")
	}
	reply, err := lim.runner.Run(ctx, script, []string{c.key}, args, nil)
	if err != nil {
		return Result{}, corrupt(fmt.Errorf("funnel: peek: %w", reach.Mark(err)))
	}
	res, err := afterProceed(reply, "peek")
	if err != nil {
		return Result{}, err
	}
	r, err := lim.read(c, res)
	if err != nil {
		return Result{}, err
	}
	lim.clock.sampled(r.now, time.Now())
	return peeked(c.rules, r), nil
}

// peeked is what a call of one unit would get on r, with nothing taken.
func peeked(rules []rule, r reading) Result {
	d := decide(rules, r.levels, r.now, 1)
	if r.till > 0 {
		return boxed(d, rules, r.now, r.till)
	}
	if d.allowed { // nothing was taken: report the state as it is
		d.unpeek(rules)
	}
	return d.result(rules)
}

// afterProceed returns read.lua's result, or that of a script that runs
// it, after its first value; script names it in the error.
func afterProceed(reply any, script string) (any, error) {
	arr, ok := reply.([]any)
	if !ok || len(arr) < 1 {
		return nil, fmt.Errorf("%w: %s returned %T", ErrCorruptState, script, reply)
	}
	return arr[1:], nil
}

// Refund gives n units back to every rule of key, never below empty, for
// a call that was admitted but did not happen. A Window rule gives back its
// newest units. It takes the key's lock.
func (lim *Limiter) Refund(ctx context.Context, key string, n int64, rules ...Rule) error {
	if ctx == nil {
		return ErrNilContext
	}
	c, err := lim.prepare(key, rules)
	if err != nil {
		return err
	}
	if n < 1 {
		return fmt.Errorf("%w: refund of %d units", ErrInvalidN, n)
	}
	for range maxCommits {
		if done, err := lim.refundOnce(ctx, c, n); done {
			return err
		}
	}
	return ErrConflict
}

// refundOnce reads c's key with its lock and commits the refund of n
// units; done is false when the lease lapsed first.
func (lim *Limiter) refundOnce(ctx context.Context, c call, n int64) (done bool, err error) {
	lk, res, err := lim.locker.LockWith(ctx, c.name, c.read(readAll), lim.hold...)
	if err != nil {
		return true, corrupt(err)
	}
	res, err = afterProceed(res, "read")
	var snap snapshot
	if err == nil {
		snap, err = parseRead(c.rules, res)
	}
	if err != nil {
		_, _ = lim.unlock(ctx, lk, nil)
		return true, err
	}
	fills, ats, logs := refund(c.rules, snap.levels, snap.now, n)
	args := writeArgs(c.rules, fills, ats, logs, snap.now, noDeadline)
	return lim.release(ctx, c, lk, writeBack, args)
}

// Reset forgets every rule's state for key, under its lock.
func (lim *Limiter) Reset(ctx context.Context, key string) error {
	if ctx == nil {
		return ErrNilContext
	}
	if err := lim.check(key); err != nil {
		return err
	}
	c := call{key: lim.stateKey(key), name: key}
	for range maxCommits {
		lk, err := lim.locker.Lock(ctx, c.name, lim.hold...)
		if err != nil {
			return err
		}
		if done, err := lim.release(ctx, c, lk, resetAll, nil); done {
			return err
		}
	}
	return ErrConflict
}

// release runs f with args on c's key if lk is still held and releases it,
// then clears the key's cached denial; done is false when the lease lapsed
// first: nothing was written.
func (lim *Limiter) release(ctx context.Context, c call, lk *mutex.Lock, f *mutex.Fragment, args []any) (done bool, err error) {
	_, err = lim.unlock(ctx, lk, &mutex.Call{Fragment: f, Keys: []string{c.key}, Args: args})
	lim.denials.forget(c.key) // after the commit, and after an error: it may have committed
	if errors.Is(err, mutex.ErrNotHeld) {
		return false, nil
	}
	return true, err
}
