package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/funnelguard/funnelguard/mutex"
)

// A slot is a running call's place among the InFlight calls of its key: a
// permit in Redis, a place in this process's count (failing open while
// Redis cannot answer), or nothing (the zero slot).
type slot struct {
	permit   *mutex.Permit
	key      string // the stored key of a place in g.flights
	degraded error  // ErrUnavailable of a permit's call that made the slot a place in g.flights
}

// context is the context of the call in s, cancelled if its permit is lost.
func (s slot) context(parent context.Context) context.Context {
	if s.permit == nil {
		return parent
	}
	return s.permit.Context(parent)
}

// enter takes a slot for a call of the stored key sk that an admission
// let through (degraded: made without Redis, and so is the slot); an error
// (WithInFlight's) means the call must not run. While Redis cannot answer,
// failing open, the slot is a place in flights, with ErrUnavailable unless
// the admission was degraded already.
func (g *Guard) enter(ctx context.Context, sk string, degraded bool) (slot, error) {
	var uerr error
	if !degraded {
		p, err := g.acquire(ctx, sk)
		switch {
		case err == nil:
			return slot{permit: p}, nil
		case !errors.Is(err, ErrUnavailable) || g.open == nil:
			return slot{}, err
		}
		uerr = err
	}
	if !g.flights.enter(sk, g.cfg.InFlight) {
		return slot{}, fmt.Errorf("%w: %d calls of the key run in this process: %w", ErrBusy, g.cfg.InFlight, ErrUnavailable)
	}
	return slot{key: sk, degraded: uerr}, nil
}

// acquire takes a permit of sk's semaphore, renewed until given back, or
// ErrBusy when none came free within Timeout.
func (g *Guard) acquire(ctx context.Context, sk string) (*mutex.Permit, error) {
	sem, err := g.lim.Locker().Semaphore(sk, g.cfg.InFlight)
	if err != nil { // New tried the Locker and the size: never, for a stored key
		return nil, fmt.Errorf("%w: %w", ErrRejected, err)
	}
	var p *mutex.Permit
	busy := false // a wait in sem's queue ended without a permit at cctx's deadline
	err = g.watch.Run(ctx, g.cfg.Timeout, func(cctx context.Context) (err error) {
		if p, err = sem.TryAcquire(cctx, 1, g.permit...); !errors.Is(err, mutex.ErrNoPermits) {
			return err
		}
		// Redis has just answered: a wait that ends without a permit is one
		// for the calls running, not for Redis.
		p, err = sem.Acquire(cctx, 1, g.permit...)
		busy = errors.Is(err, mutex.ErrNotObtained) && errors.Is(cctx.Err(), context.DeadlineExceeded)
		return err
	})
	switch {
	case err == nil || ctx.Err() != nil:
		return p, err
	case busy && !errors.Is(err, mutex.ErrUnreachable):
		return nil, fmt.Errorf("%w: %d calls of the key ran through %v: %w", ErrBusy, g.cfg.InFlight, g.cfg.Timeout, err)
	case errors.Is(err, mutex.ErrInvalid): // Redis keeps the semaphore with another size
		return nil, fmt.Errorf("%w: %w", ErrRejected, err)
	}
	_, err = g.failed(ctx, err)
	return nil, err
}

// leave gives s back, as Call.Done says.
func (g *Guard) leave(ctx context.Context, s slot) {
	switch {
	case s.permit != nil:
		_ = g.watch.Run(context.WithoutCancel(ctx), g.cfg.Timeout, s.permit.Release)
	case s.key != "":
		g.flights.leave(s.key)
	}
}

// flights counts each key's calls running in this process, for InFlight
// while Redis cannot answer; only keys with calls running have an entry.
type flights struct {
	mu sync.Mutex
	n  map[string]int64
}

func (f *flights) enter(key string, bound int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[key] >= bound {
		return false
	}
	f.n[key]++
	return true
}

func (f *flights) leave(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[key]--; f.n[key] <= 0 {
		delete(f.n, key)
	}
}
