package funnel

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/internal/reach"
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
// mutex: every lock script answers a retry as its first run). A call with a
// ctx deadline that returns an error took nothing, whenever its commands
// run (see "A failed call is not charged" in the package documentation for
// what holds); without a deadline, an error after the write was sent may
// leave the call admitted. Calling again is a new call.
//
// Concurrent calls for one key with the same rules share a lock hold (see
// WithoutBatching): the calls that arrive while one takes the lock are
// decided with it, in arrival order, and written with it. A call whose ctx
// ends while it waits returns ctx's error at once; if its batch decided it
// meanwhile, that outcome is returned instead.
func (lim *Limiter) AllowN(ctx context.Context, key string, n int64, rules ...Rule) (Result, error) {
	if ctx == nil {
		return Result{}, ErrNilContext
	}
	c, err := lim.prepare(key, rules)
	if err != nil {
		return Result{}, err
	}
	if err := checkN(c.rules, n); err != nil {
		return Result{}, err
	}
	if res, ok := lim.denials.lookup(c.key, c.set, n); ok {
		return res, nil
	}
	if !lim.alone {
		return lim.allowBatched(ctx, c, n)
	}
	return lim.allowAlone(ctx, c, n)
}

// allowAlone is AllowN's path without batching: a batch of one, led by this
// call, whose outcome is final (a leader never runs again).
func (lim *Limiter) allowAlone(ctx context.Context, c call, n int64) (Result, error) {
	d, _ := ctx.Deadline()
	b := newBatch(n, d)
	lim.lead(ctx, c, batchKey{}, b, n)
	return outcome(ctx, b.leader.res, b.leader.err)
}

// checkKey reports an error matching ErrInvalidKey unless key has 1 to
// MaxKeyLen bytes.
func checkKey(key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes (want 1 to %d)", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

// checkN reports an error matching ErrInvalidN unless n units fit in every
// rule.
func checkN(rules []rule, n int64) error {
	for _, r := range rules {
		if n < 1 || n > r.full/r.per { // not n*per > full: that can overflow
			return fmt.Errorf("%w: %d units for rule %q of capacity %d", ErrInvalidN, n, r.name, r.full/r.per)
		}
	}
	return nil
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
	if ctx == nil {
		return Result{}, ErrNilContext
	}
	c, err := lim.prepare(key, rules)
	if err != nil {
		return Result{}, err
	}
	reply, err := lim.peek(ctx, c)
	if err != nil {
		return Result{}, err
	}
	r, err := lim.read(c, reply)
	if err != nil {
		return Result{}, err
	}
	lim.clock.sampled(r.now, time.Now())
	return peeked(c.rules, r), nil
}

// peek runs Peek's script for c, read.lua or, with the penalty box,
// penalty.lua counting nothing, and returns its result after proceed.
func (lim *Limiter) peek(ctx context.Context, c call) (any, error) {
	script, args := readPeek, c.ids
	if lim.penalty != nil {
		script, args = penaltyPeek, c.penalized(lim.penalty, "0")
	}
	reply, err := lim.runner.Run(ctx, script, []string{c.key}, args, nil)
	if err != nil {
		return nil, corrupt(fmt.Errorf("funnel: peek: %w", reach.Mark(err)))
	}
	return afterProceed(reply, "peek")
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

// afterProceed returns the result of read.lua, or of a script that runs it,
// after its first value, proceed; script names it in the error of a reply
// of another shape.
func afterProceed(reply any, script string) (any, error) {
	arr, ok := reply.([]any)
	if !ok || len(arr) < 1 {
		return nil, fmt.Errorf("%w: %s returned %T", ErrCorruptState, script, reply)
	}
	return arr[1:], nil
}

// Refund gives n units back to every rule of key, never below empty: for a
// call that was admitted but did not happen (the SMS provider refused the
// message). A Window rule gives back its newest n units. It takes the lock like an admission.
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

// refundOnce takes the lock of c's key, reading its state, and commits the
// refund of n units. done is false when the lease lapsed before the commit:
// nothing was written.
func (lim *Limiter) refundOnce(ctx context.Context, c call, n int64) (done bool, err error) {
	lk, res, err := lim.locker.LockWith(ctx, c.name, c.read(readAll), lim.hold...)
	if err != nil {
		return true, corrupt(err)
	}
	args, err := refundArgs(c.rules, res, n)
	if err != nil {
		_, _ = lim.unlock(ctx, lk, nil)
		return true, err
	}
	return lim.release(ctx, c, lk, writeBack, args)
}

// refundArgs returns the write script's arguments for the refund of n
// units on the state read.lua returned.
func refundArgs(rules []rule, res any, n int64) ([]any, error) {
	res, err := afterProceed(res, "read")
	if err != nil {
		return nil, err
	}
	snap, err := parseRead(rules, res)
	if err != nil {
		return nil, err
	}
	fills, ats, logs := refund(rules, snap.levels, snap.now, n)
	return writeArgs(rules, fills, ats, logs, snap.now, noDeadline), nil
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

// release runs script f with args on c's key if lk is still held, and
// releases it: the commit of a Refund or Reset, after which the deny cache
// forgets the key. done is false when the lease lapsed first: nothing was
// written.
func (lim *Limiter) release(ctx context.Context, c call, lk *mutex.Lock, f *mutex.Fragment, args []any) (done bool, err error) {
	_, err = lim.unlock(ctx, lk, &mutex.Call{Fragment: f, Keys: []string{c.key}, Args: args})
	lim.denials.forget(c.key) // after the commit, and after an error: it may have committed
	if errors.Is(err, mutex.ErrNotHeld) {
		return false, nil
	}
	return true, err
}
