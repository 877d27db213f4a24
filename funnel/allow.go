package funnel

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/mutex"
)

// Allow is shorthand for AllowN(ctx, key, 1, rules...).
func (lim *Limiter) Allow(ctx context.Context, key string, rules ...Rule) (Result, error) {
	return lim.AllowN(ctx, key, 1, rules...)
}

// AllowN admits n units for key if they fit in every rule, and then takes
// them from every rule; if any rule has no room, it takes nothing from any
// (all or nothing). n must be at least 1 and at most every rule's Capacity.
//
// A call that is deniable when it arrives is denied from the state read with
// its first lock attempt: one round trip, even while another caller holds the
// key's lock. An admission waits for the lock if needed (re-reading the state
// with each attempt, so it is denied as soon as the state says so) and
// commits only while holding it; a commit whose lock lease lapsed is rejected
// by Redis and the call starts over, so a stale decision never overwrites
// newer state. A reply lost and retried by go-redis counts once (see package
// mutex: every lock script answers a retry as its first run). On error the
// call may or may not have been admitted; calling again is a new call.
func (lim *Limiter) AllowN(ctx context.Context, key string, n int64, rules ...Rule) (Result, error) {
	c, err := lim.prepare(key, rules)
	if err != nil {
		return Result{}, err
	}
	for _, r := range c.rules {
		if n < 1 || n > r.full/r.per { // not n*per > full: that can overflow
			return Result{}, fmt.Errorf("%w: %d units for rule %q of capacity %d", ErrInvalidN, n, r.name, r.full/r.per)
		}
	}
	for range maxCommits {
		// One attempt first: a call that is already deniable is denied by
		// the gate in this round trip, never queued behind local waiters.
		lk, res, err := lim.locker.TryLockWith(ctx, c.name, c.read(readGate), lim.hold)
		if errors.Is(err, mutex.ErrLocked) {
			lk, res, err = lim.locker.LockWith(ctx, c.name, c.read(readGate), lim.hold)
		}
		declined := errors.Is(err, mutex.ErrDeclined)
		if err != nil && !declined {
			return Result{}, corrupt(err)
		}
		snap, perr := parseRead(c.rules, res)
		if perr != nil {
			_ = lk.Unlock(ctx)
			return Result{}, perr
		}
		d := decide(c.rules, snap.levels, snap.now, n)
		if declined || !d.allowed {
			_ = lk.Unlock(ctx) // nil when declined
			d.allowed = false
			d.retry = max(d.retry, 1) // the gate and decide agree; never "retry now" on a denial
			return d.result(c.rules), nil
		}
		if lim.beforeCommit != nil {
			lim.beforeCommit()
		}
		write := mutex.Call{Fragment: writeBack, Keys: []string{c.key}, Args: writeArgs(c.rules, d.fills, d.ats, snap.now)}
		if _, err := lk.UnlockWith(ctx, write); errors.Is(err, mutex.ErrNotHeld) {
			continue // the lease lapsed: decide again on fresh state
		} else if err != nil {
			return Result{}, err
		}
		return d.result(c.rules), nil
	}
	return Result{}, ErrConflict
}

// corrupt marks a Redis WRONGTYPE error: the state key holds something
// other than a funnel's hash.
func corrupt(err error) error {
	if err != nil && strings.Contains(err.Error(), "WRONGTYPE") {
		return fmt.Errorf("%w: %w", ErrCorruptState, err)
	}
	return err
}

// Peek reports what Allow would decide for key now, changing nothing and
// taking no lock: one round trip.
func (lim *Limiter) Peek(ctx context.Context, key string, rules ...Rule) (Result, error) {
	c, err := lim.prepare(key, rules)
	if err != nil {
		return Result{}, err
	}
	reply, err := ctxcall.Do(ctx, lim.honours, func(ctx context.Context) (any, error) {
		return readPeek.Run(ctx, lim.client, []string{c.key}, c.ids...).Result()
	}, nil)
	if err != nil {
		return Result{}, corrupt(fmt.Errorf("funnel: peek: %w", err))
	}
	arr, ok := reply.([]any)
	if !ok || len(arr) < 1 {
		return Result{}, fmt.Errorf("%w: peek returned %T", ErrCorruptState, reply)
	}
	snap, err := parseRead(c.rules, arr[1:]) // after proceed
	if err != nil {
		return Result{}, err
	}
	d := decide(c.rules, snap.levels, snap.now, 1)
	if d.allowed { // nothing was taken: report the state as it is
		for i, r := range c.rules {
			d.fills[i] -= r.per
		}
	}
	return d.result(c.rules), nil
}

// Refund gives n units back to every rule of key, never below empty: for a
// call that was admitted but did not happen (the SMS provider refused the
// message). It takes the lock like an admission.
func (lim *Limiter) Refund(ctx context.Context, key string, n int64, rules ...Rule) error {
	c, err := lim.prepare(key, rules)
	if err != nil {
		return err
	}
	if n < 1 {
		return fmt.Errorf("%w: refund of %d units", ErrInvalidN, n)
	}
	for range maxCommits {
		lk, res, err := lim.locker.LockWith(ctx, c.name, c.read(readAll), lim.hold)
		if err != nil {
			return corrupt(err)
		}
		arr, ok := res.([]any)
		if !ok || len(arr) < 1 {
			_ = lk.Unlock(ctx)
			return fmt.Errorf("%w: read returned %T", ErrCorruptState, res)
		}
		snap, err := parseRead(c.rules, arr[1:]) // after proceed
		if err != nil {
			_ = lk.Unlock(ctx)
			return err
		}
		fills, ats := refund(c.rules, snap.levels, snap.now, n)
		write := mutex.Call{Fragment: writeBack, Keys: []string{c.key}, Args: writeArgs(c.rules, fills, ats, snap.now)}
		if _, err := lk.UnlockWith(ctx, write); errors.Is(err, mutex.ErrNotHeld) {
			continue
		} else if err != nil {
			return err
		}
		return nil
	}
	return ErrConflict
}

// Reset forgets every rule's state for key, under its lock.
func (lim *Limiter) Reset(ctx context.Context, key string) error {
	if err := lim.check(key); err != nil {
		return err
	}
	c := call{key: lim.stateKey(key), name: key}
	for range maxCommits {
		lk, err := lim.locker.Lock(ctx, c.name, lim.hold)
		if err != nil {
			return err
		}
		if _, err := lk.UnlockWith(ctx, mutex.Call{Fragment: resetAll, Keys: []string{c.key}}); errors.Is(err, mutex.ErrNotHeld) {
			continue
		} else if err != nil {
			return err
		}
		return nil
	}
	return ErrConflict
}
