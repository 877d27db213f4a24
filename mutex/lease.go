package mutex

import (
	"context"
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
)

// A life is a hold's or Permit's lease as this process knows it: a
// conservative end on the client's monotonic clock. It ends once; its timer
// runs only while watched or renewed. mu guards it and its owner's state.
type life struct {
	mu    sync.Mutex
	sent  time.Time     // when the script that set the lease was sent,
	lease time.Duration // and the lease it set: it surely lasts until deadline()
	ended bool          // released, handed over or lost
	timer *time.Timer   // checks the deadline; nil until someone watches
	renew *renewal      // nil unless WithAutoRenew
}

// A lifeOwner is what a life belongs to, and what renewLoop keeps alive: a
// lock's hold or a Permit.
type lifeOwner interface {
	// endLocked ends the owner and its handles in phase p, once; mu is held.
	endLocked(p phase)
	// renewOnce extends the lease once and records it; held false with a
	// nil error means it is gone.
	renewOnce(ctx context.Context, lease time.Duration) (held bool, err error)
	// lose ends it as lost: taken or gone, never re-acquired.
	lose()
}

// drift is the margin by which the lease may end early on the client's
// clock, the server's clock running faster (the Redlock paper's).
func drift(lease time.Duration) time.Duration {
	return lease/100 + 2*time.Millisecond
}

// leaseEnd is the local end of a lease set by a script sent at start.
func leaseEnd(start time.Time, lease time.Duration) time.Time {
	return start.Add(lease - drift(lease))
}

// deadline is the local end of the lease (leaseEnd).
func (l *life) deadline() time.Time { return leaseEnd(l.sent, l.lease) }

// setLease records the lease set by a script sent at start.
func (l *life) setLease(start time.Time, lease time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.sent, l.lease = start, lease
	if l.timer != nil {
		l.timer.Reset(time.Until(l.deadline()))
	}
}

// finishLocked ends the life; false when it had ended already.
func (l *life) finishLocked() bool {
	if l.ended {
		return false
	}
	l.ended = true
	if l.timer != nil {
		l.timer.Stop()
	}
	if l.renew != nil {
		l.renew.stopLocked()
	}
	return true
}

// expireLocked ends o as lost if its lease has passed, without waiting for
// the timer, which may be late or stopped; it reports whether it has ended.
func (l *life) expireLocked(o lifeOwner) bool {
	if !l.ended && !time.Now().Before(l.deadline()) {
		o.endLocked(lost)
	}
	return l.ended
}

// endedLocked returns the cause of s's handle once it has ended, else nil.
func (l *life) endedLocked(o lifeOwner, s *lifeSignal) error {
	l.expireLocked(o)
	if s.phase >= released {
		return s.phase.cause()
	}
	return nil
}

// watchedLocked is endedLocked that starts the deadline timer while open.
func (l *life) watchedLocked(o lifeOwner, s *lifeSignal) error {
	err := l.endedLocked(o, s)
	if err == nil {
		l.watchLocked(o)
	}
	return err
}

func (l *life) watchLocked(o lifeOwner) {
	if l.ended || l.timer != nil {
		return
	}
	l.timer = time.AfterFunc(time.Until(l.deadline()), func() { l.checkDeadline(o) })
}

// checkDeadline ends o as lost once the lease has passed, a release under
// way or not: its script may find the lock given to another.
func (l *life) checkDeadline(o lifeOwner) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	if left := time.Until(l.deadline()); left > 0 {
		l.timer.Reset(left) // extended meanwhile
		return
	}
	o.endLocked(lost)
}

func (l *life) end(o lifeOwner, p phase) {
	l.mu.Lock()
	defer l.mu.Unlock()
	o.endLocked(p)
}

func (l *life) done(o lifeOwner, s *lifeSignal) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return s.doneLocked(l.watchedLocked(o, s))
}

func (l *life) context(o lifeOwner, s *lifeSignal, parent context.Context) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return s.deriveLocked(&l.mu, parent, l.watchedLocked(o, s))
}

func (l *life) leaseDeadline(o lifeOwner, s *lifeSignal) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ok := l.endedLocked(o, s) == nil
	return l.deadline(), ok
}

// startRenew renews o's lease every third of lease (WithAutoRenew).
func (l *life) startRenew(o lifeOwner, lease time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || l.renew != nil {
		return
	}
	r := &renewal{stop: make(chan struct{}), done: make(chan struct{})}
	l.renew = r
	l.watchLocked(o) // the deadline timer reports loss if renewals keep failing
	go renewLoop(o, r, lease)
}

func (l *life) stopRenew() {
	l.mu.Lock()
	r := l.renew
	if r == nil {
		l.mu.Unlock()
		return
	}
	r.stopLocked()
	l.mu.Unlock()
	<-r.done
}

// A lifeSignal is a handle's phase, Done's channel and Context's contexts,
// fired by the call that ends the handle before it returns (an AfterFunc
// would be later). Guarded by the life's mu.
type lifeSignal struct {
	phase  phase
	ctx    context.Context // Done's; made on first use
	cancel context.CancelCauseFunc
	subs   map[uint64]context.CancelCauseFunc // Context's, until they end
	next   uint64
}

// abortRelease puts s, a handle whose release failed, back to held, unless
// it ended meanwhile (its lease passed).
func (l *life) abortRelease(s *lifeSignal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s.phase == releasing {
		s.phase = held
	}
}

// endLocked ends s in phase p, once, cancelling its contexts with p's cause.
func (s *lifeSignal) endLocked(p phase) {
	if s.phase >= released {
		return
	}
	s.phase = p
	if s.cancel != nil {
		s.cancel(p.cause())
	}
	for _, cancel := range s.subs {
		cancel(p.cause())
	}
	s.subs = nil
}

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
// cause when it ends (ended: it has). mu guards s: a context that ends on
// its own is forgotten under it.
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

type renewal struct {
	stop    chan struct{} // closed to end the goroutine
	stopped bool          // guarded by life.mu
	done    chan struct{} // closed when the goroutine has returned
}

func (r *renewal) stopLocked() {
	if !r.stopped {
		r.stopped = true
		close(r.stop)
	}
}

func (h *hold) renewOnce(ctx context.Context, lease time.Duration) (bool, error) {
	start := time.Now()
	held, err := h.locker.dep.extend(ctx, h, argFresh, lease, start)
	if err == nil && held {
		h.setLease(start, lease)
	}
	return held, err
}

func renewLoop(x lifeOwner, r *renewal, lease time.Duration) {
	defer close(r.done)
	period := max(lease/3, time.Millisecond)
	t := time.NewTimer(period)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		// An attempt takes at most a period: a slow Redis never hides the deadline.
		ctx, cancel := ctxcall.DeadlineOnly(context.Background(), time.Now().Add(period))
		held, err := x.renewOnce(ctx, lease)
		cancel()
		if err == nil && !held {
			x.lose() // taken or gone: never re-acquire
			return
		}
		// On an error keep trying; the deadline timer ends a lease that passed.
		t.Reset(period)
	}
}
