package funnel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/mutex"
)

// Peek reports what Allow would decide for key now, changing nothing and
// taking no lock: one round trip.
func (lim *Limiter) Peek(ctx context.Context, key string, rules ...Rule) (Result, error) {
	c, err := lim.prepare(ctx, key, rules)
	if err != nil {
		return Result{}, err
	}
	c.key, _ = lim.keys(key)
	script, args := readPeek, c.set.ids
	if lim.penalty != nil {
		script, args = penaltyPeek, c.penalized(lim.penalty, "0")
	}
	reply, err := lim.locker.Eval(ctx, script, []string{c.key}, args...)
	if err != nil {
		return Result{}, corrupt(fmt.Errorf("funnel: peek: %w", err))
	}
	arr, _ := reply.([]any) // {proceed, now, value...}: parseRead judges its shape
	r, err := parseRead(c.set.rules, arr[min(1, len(arr)):])
	if err != nil {
		return Result{}, err
	}
	lim.clock.sampled(r.now, time.Now())
	d := decide(c.set.rules, r.levels, r.now, 1) // what a call of one unit would get
	switch {
	case r.till > 0:
		return boxed(d, c.set.rules, r.now, r.till), nil
	case d.allowed: // nothing was taken: report the state as it is
		d.unpeek(c.set.rules)
	}
	return d.result(c.set.rules), nil
}

// Refund gives n units back to every rule of key, never below empty, for
// a call that was admitted but did not happen. A Window rule gives back its
// newest units. It takes the key's lock.
func (lim *Limiter) Refund(ctx context.Context, key string, n int64, rules ...Rule) error {
	c, err := lim.prepare(ctx, key, rules)
	if err != nil {
		return err
	}
	c.key, _ = lim.keys(key)
	if n < 1 {
		return fmt.Errorf("%w: refund of %d units", ErrInvalidN, n)
	}
	return lim.locked(ctx, c, readAll, func(reply any) (*mutex.Fragment, []any, error) {
		arr, _ := reply.([]any) // {proceed, now, value...}: parseRead judges its shape
		snap, err := parseRead(c.set.rules, arr[min(1, len(arr)):])
		if err != nil {
			return nil, nil, err
		}
		return writeBack, writeArgs(c.set.rules, refund(c.set.rules, snap.levels, snap.now, n), snap.now, noDeadline), nil
	})
}

// Reset forgets every rule's state for key, under its lock.
func (lim *Limiter) Reset(ctx context.Context, key string) error {
	if err := lim.check(ctx, key); err != nil {
		return err
	}
	c := call{name: key}
	c.key, _ = lim.keys(key)
	return lim.locked(ctx, c, nil, func(any) (*mutex.Fragment, []any, error) { return resetAll, nil, nil })
}

// locked takes c's key's lock, reading the state with read (nil: none),
// and releases it running the write that write returns for the read, then
// clears the key's cached denial; again while the lease lapsed first, which
// wrote nothing.
func (lim *Limiter) locked(ctx context.Context, c call, read *mutex.Fragment, write func(reply any) (*mutex.Fragment, []any, error)) error {
	for range maxCommits {
		lk, reply, err := lim.lockRead(ctx, c, read)
		if err != nil {
			return err
		}
		f, args, err := write(reply)
		if err != nil {
			_, _ = lim.unlock(ctx, lk, nil)
			return err
		}
		_, err = lim.unlock(ctx, lk, &mutex.Call{Fragment: f, Keys: []string{c.key}, Args: args})
		if lim.denials != nil { // after the commit, and after an error: it may have committed
			lim.denials.forget(c.name)
		}
		if !errors.Is(err, mutex.ErrNotHeld) {
			return err
		}
	}
	return ErrConflict
}

func (lim *Limiter) lockRead(ctx context.Context, c call, read *mutex.Fragment) (*mutex.Lock, any, error) {
	if read == nil {
		lk, err := lim.locker.Lock(ctx, c.name, lim.hold...)
		return lk, nil, err
	}
	lk, reply, err := lim.locker.LockWith(ctx, c.name, c.read(read), lim.hold...)
	return lk, reply, corrupt(err)
}
