package ctxcall

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Honours reports whether client is known to bound its commands by their
// context's deadline: a go-redis Client, ClusterClient or Ring made with
// ContextTimeoutEnabled and no negative read or write timeout (go-redis then
// sets no deadline on the socket at all). Anything else (another client
// type, a wrapper) is taken not to.
func Honours(client any) bool {
	switch c := client.(type) {
	case interface{ Options() *redis.Options }:
		o := c.Options()
		return bounds(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	case interface{ Options() *redis.ClusterOptions }:
		o := c.Options()
		return bounds(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	case interface{ Options() *redis.RingOptions }:
		o := c.Options()
		return bounds(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	}
	return false
}

// bounds reports whether go-redis bounds a socket read and write by the
// context's deadline under these options.
func bounds(enabled bool, read, write time.Duration) bool {
	return enabled && read >= 0 && write >= 0
}

// Do returns f(ctx). When w is not nil (Runner.Workers: the client does not
// bound f by ctx's end) and ctx can end, f runs in one of w's goroutines and
// Do returns when ctx ends, if that comes first, with an error matching
// ErrAbandoned and ctx.Err(); late, if not nil, then receives f's outcome
// when it arrives (to undo what f did, for example), in that goroutine.
func Do[T any](ctx context.Context, w *Workers, f func(context.Context) (T, error), late func(T, error)) (T, error) {
	if w == nil || ctx.Done() == nil {
		v, err := f(ctx)
		return v, settled(ctx, err)
	}
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	type outcome struct {
		v   T
		err error
	}
	// The goroutine either hands its outcome to the caller or, once the
	// caller has left, to late: never both, never neither.
	var mu sync.Mutex
	abandoned := false
	done := make(chan outcome, 1)
	w.run(func() {
		v, err := f(ctx)
		mu.Lock()
		if !abandoned {
			done <- outcome{v, err}
			mu.Unlock()
			return
		}
		mu.Unlock()
		if late != nil {
			late(v, err)
		}
	})
	select {
	case o := <-done:
		return o.v, settled(ctx, o.err)
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case o := <-done: // both ready: the outcome is known, so report it
		return o.v, settled(ctx, o.err)
	default:
	}
	abandoned = true
	return zero, fmt.Errorf("%w: %w", ErrAbandoned, ctx.Err())
}

// ErrAbandoned is joined with ctx.Err() when Do returned before f did: f's
// outcome goes to late. A ctx cancelled before its deadline ends a call so
// on any client; a deadline does only on a client without
// ContextTimeoutEnabled, which the message names.
var ErrAbandoned = errors.New("outcome unknown: the call was abandoned at its context's end (a cancellation, or a deadline that the Redis client does not bound its commands by: set ContextTimeoutEnabled in its options)")

// timedOut reports whether err is a time-out. (Its own function, so that
// the target errors.As takes the address of is not allocated on the calls
// that have no error.)
func timedOut(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// settled is err, f's error, joined with ctx's deadline error when it is a
// time-out and ctx's deadline has passed: go-redis's socket deadline (the
// context's deadline, ContextTimeoutEnabled) can fire before ctx's own
// timer runs on a loaded machine, and the caller must still see that its
// deadline ended the call.
func settled(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !timedOut(err) {
		return err
	}
	if cerr := Ended(ctx); cerr != nil {
		return fmt.Errorf("%w: %w", err, cerr)
	}
	return err
}

// Ended returns ctx's error once ctx has ended or its deadline has passed
// (a deadline's timer may fire late on a loaded machine, and Err stays nil
// until it does), else nil.
func Ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}
