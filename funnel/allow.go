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
//
// Concurrent calls for one key with the same rules share a lock hold (see
// WithoutBatching): the calls that arrive while one takes the lock are
// decided with it, in arrival order, and written with it. A call whose ctx
// ends while it waits returns ctx's error at once; if its batch decided it
// meanwhile, that outcome is returned instead.
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
	if res, ok := lim.denials.lookup(c.key, c.set, n); ok {
		return res, nil
	}
	if !lim.alone {
		return lim.allowBatched(ctx, c, n)
	}
	// Alone: a batch of one, led by this call.
	w := &waiter{n: n}
	lim.lead(ctx, c, batchKey{}, &batch{waiters: []*waiter{w}}, n)
	return w.res, w.err
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
	script, args := readPeek, c.ids
	if lim.penalty != nil {
		script, args = penaltyPeek, c.penalized(lim.penalty, "0")
	}
	reply, err := ctxcall.Do(ctx, lim.honours, func(ctx context.Context) (any, error) {
		return script.Run(ctx, lim.client, []string{c.key}, args...).Result()
	}, nil)
	if err != nil {
		return Result{}, corrupt(fmt.Errorf("funnel: peek: %w", err))
	}
	arr, ok := reply.([]any)
	if !ok || len(arr) < 1 {
		return Result{}, fmt.Errorf("%w: peek returned %T", ErrCorruptState, reply)
	}
	res, till := lim.unbox(c, arr[1:]) // after proceed
	snap, err := parseRead(c.rules, res)
	if err != nil {
		return Result{}, err
	}
	d := decide(c.rules, snap.levels, snap.now, 1)
	if till > 0 {
		return boxed(d, c.rules, snap.now, till), nil
	}
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
		lk, res, err := lim.locker.LockWith(ctx, c.name, c.read(readAll), lim.hold...)
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
		_, err = lk.UnlockWith(ctx, write)
		lim.denials.forget(c.key) // after the commit, and after an error: it may have committed
		if errors.Is(err, mutex.ErrNotHeld) {
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
		lk, err := lim.locker.Lock(ctx, c.name, lim.hold...)
		if err != nil {
			return err
		}
		_, err = lk.UnlockWith(ctx, mutex.Call{Fragment: resetAll, Keys: []string{c.key}})
		lim.denials.forget(c.key) // after the commit, and after an error: it may have committed
		if errors.Is(err, mutex.ErrNotHeld) {
			continue
		} else if err != nil {
			return err
		}
		return nil
	}
	return ErrConflict
}
