package mutex

import (
	"context"
	"sync"
)

// A lifeSignal is a handle's (a Lock's or a Permit's) phase and how it tells
// that it ended: the channel of Done and the contexts of Context. The call
// that ends the handle fires it, so every one of them is closed or
// cancelled before that call returns (a context.AfterFunc would cancel them
// later, in a goroutine of its own). Its methods run under the mutex of the
// handle's life, which the caller holds.
type lifeSignal struct {
	phase  phase
	ctx    context.Context // Done's; made on first use
	cancel context.CancelCauseFunc
	subs   map[uint64]context.CancelCauseFunc // Context's, until they end
	next   uint64
}

// endLocked ends the handle in phase p, once.
func (s *lifeSignal) endLocked(p phase) {
	if s.phase >= released {
		return
	}
	s.phase = p
	s.fireLocked(p.cause())
}

// causeLocked returns the handle's cause once it has ended, else nil.
func (s *lifeSignal) causeLocked() error {
	if s.phase >= released {
		return s.phase.cause()
	}
	return nil
}

// doneLocked returns the channel closed when the handle ends; ended is the
// handle's cause if it has ended already.
func (s *lifeSignal) doneLocked(ended error) <-chan struct{} {
	if s.ctx == nil {
		s.ctx, s.cancel = context.WithCancelCause(context.Background())
		if ended != nil {
			s.cancel(ended)
		}
	}
	return s.ctx.Done()
}

// deriveLocked returns a context of parent cancelled with the handle's
// cause when it ends: at once when it has ended already (ended is its
// cause), else by fireLocked. mu guards s: a context that ends on its own
// is forgotten under it.
func (s *lifeSignal) deriveLocked(mu sync.Locker, parent context.Context, ended error) context.Context {
	ctx, cancel := context.WithCancelCause(parent)
	if ended != nil {
		cancel(ended)
		return ctx
	}
	if s.subs == nil {
		s.subs = make(map[uint64]context.CancelCauseFunc)
	}
	id := s.next
	s.next++
	s.subs[id] = cancel
	context.AfterFunc(ctx, func() {
		mu.Lock()
		delete(s.subs, id)
		mu.Unlock()
	})
	return ctx
}

// fireLocked ends Done's channel and every context with cause.
func (s *lifeSignal) fireLocked(cause error) {
	if s.cancel != nil {
		s.cancel(cause)
	}
	for _, cancel := range s.subs {
		cancel(cause)
	}
	s.subs = nil
}
