package mutex

import (
	"context"
	"errors"
	"slices"
	"time"
)

// maxChain is how many times in a row a lock passes between goroutines of one
// Locker before it is released to all comers.
const maxChain = 8

// A queue holds the goroutines of one Locker that wait for one name. Guarded
// by Locker.mu.
type queue struct {
	waiters    []*waiter // FIFO; waiters[0], the head, is the only one polling Redis
	chain      int       // hand-overs in a row
	subscribed bool      // to the name's release channel
}

type waiter struct {
	cfg  lockConfig
	wake chan struct{} // "try now": became head, release announced, hand-over failed
	got  chan *Lock    // a lock handed over; sent once, after removal from the queue
	// handing is set while a releaser tries to hand this waiter the lock: the
	// waiter may not leave before it learns the outcome. Guarded by Locker.mu.
	handing bool
	// delay is set when w became head because its predecessor got the lock.
	// Guarded by Locker.mu.
	delay bool
	// gated waiters run a gate (NewGate) with each attempt; recheck asks such
	// a waiter to make one attempt even if it is not the head, because a gate
	// of the name just declined; rechecked bounds that to once per waiter, so
	// that data flipping between "yes" and "no" (a funnel that leaks) cannot
	// set off a storm of attempts. Guarded by Locker.mu.
	gated, recheck, rechecked bool
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Waiters returns how many Lock and LockWith calls of this Locker are
// waiting for name now: a gauge for metrics, or for a test that must know a
// waiter has queued. A waiter marks the lock in Redis just before it queues
// here, so the mark alone does not tell.
func (l *Locker) Waiters(name string) int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[name]; q != nil {
		return len(q.waiters)
	}
	return 0
}

// wait is Lock without re-entry: queue up, and poll Redis while at the head.
// With call, each attempt runs call.Fragment; res is the result of the
// attempt that got the lock, unless handed reports that a local holder handed
// the lock over (the fragment did not run for it then). primed reports that
// the caller's attempt has just found the lock held, with a lease of pttl
// left (and marked it as the head's would): the head's first attempt is then
// that one.
func (l *Locker) wait(ctx context.Context, name string, cfg lockConfig, call *Call, primed bool, pttl time.Duration) (lk *Lock, res any, handed bool, err error) {
	w := &waiter{cfg: cfg, wake: make(chan struct{}, 1), got: make(chan *Lock, 1), gated: call != nil && call.Fragment.gate}
	l.mu.Lock()
	q := l.queues[name]
	if q == nil {
		if l.queues == nil {
			l.queues = make(map[string]*queue)
		}
		q = &queue{}
		l.queues[name] = q
		l.nqueues.Store(int64(len(l.queues)))
	}
	q.waiters = append(q.waiters, w)
	l.mu.Unlock()

	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	notify := l.canNotify()
	for {
		var tick <-chan time.Time
		queued, head, delay, recheck := l.headOf(name, w)
		if !queued {
			// A releaser took w out of the queue to hand it the lock, and
			// a stale wake-up was picked before the lock's arrival.
			return <-w.got, nil, true, nil
		}
		wait := time.Duration(-1)
		switch {
		case head && delay:
			// The waiter before w just got the lock: polling now would fail.
			wait = l.nextWait(-1)
		case head && primed:
			primed = false
			if notify && l.subscribe(ctx, name) {
				continue
			}
			wait = l.nextWait(pttl)
		case head || recheck:
			primed = false
			lk, pttl, res, err := l.attempt(ctx, name, cfg, call, true, notify, false)
			switch {
			case err == nil:
				return l.leave(ctx, name, w, lk, res, nil)
			case errors.Is(err, ErrDeclined):
				l.declined(name)
				return l.leave(ctx, name, w, nil, res, err)
			case ctx.Err() != nil:
				return l.leave(ctx, name, w, nil, nil, errors.Join(ErrNotObtained, ctx.Err()))
			case !errors.Is(err, ErrLocked):
				return l.leave(ctx, name, w, nil, nil, err)
			}
			if !head {
				break // a recheck: back to waiting for the head's events
			}
			if notify && l.subscribe(ctx, name) {
				// A release between the attempt and the subscription would
				// go unheard: try once more, now that it will be announced.
				continue
			}
			wait = l.nextWait(pttl)
		}
		primed = false // the caller's attempt stands for the first one only
		if wait >= 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			return l.leave(ctx, name, w, nil, nil, errors.Join(ErrNotObtained, ctx.Err()))
		case lk := <-w.got:
			return lk, nil, true, nil
		case <-w.wake:
		case <-tick:
		}
	}
}

// queued reports whether goroutines of l wait for name.
func (l *Locker) queued(name string) bool {
	if l.nqueues.Load() == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.queues[name] != nil
}

// headOf reports whether w is still queued (if not, a lock was handed to
// it), whether it heads its queue, whether it should let a retry interval
// pass before polling (it became head because its predecessor got the lock),
// and whether it should make one attempt although it is not the head (a gate
// declined: see declined).
func (l *Locker) headOf(name string, w *waiter) (queued, head, delay, recheck bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[name]
	if q == nil || !slices.Contains(q.waiters, w) {
		return false, false, false, false
	}
	if w.handing {
		return true, false, false, false
	}
	recheck, w.recheck = w.recheck, false
	if q.waiters[0] != w {
		return true, false, false, recheck
	}
	delay, w.delay = w.delay, false
	return true, true, delay, false
}

// declined wakes every gated waiter of name for one attempt of its own (once
// per waiter): a gate just declined, so the data they wait to change likely
// says "decline" to them too, and each learns it in one round trip of its
// own, in parallel, instead of one after another as the lock passes down the
// queue.
func (l *Locker) declined(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[name]
	if q == nil {
		return
	}
	for _, w := range q.waiters {
		if w.gated && !w.rechecked {
			w.recheck, w.rechecked = true, true
			signal(w.wake)
		}
	}
}

// leave takes w out of its queue and returns lk, res, err. A releaser may
// have handed w a lock meanwhile (w is then out of the queue, or about to
// be): leave collects it, so that no handed lock is ever left behind. It
// returns the handed lock instead when w had none of its own and was not
// leaving on an error; otherwise it passes the handed lock on (Unlock hands
// it to the next waiter) and returns its own outcome.
func (l *Locker) leave(ctx context.Context, name string, w *waiter, lk *Lock, res any, err error) (*Lock, any, bool, error) {
	l.mu.Lock()
	for w.handing {
		l.mu.Unlock()
		<-w.wake // handedOver signals or sends on got: both wake us
		l.mu.Lock()
	}
	var unsub func()
	handed := true
	if q := l.queues[name]; q != nil && slices.Contains(q.waiters, w) {
		unsub, handed = l.removeLocked(name, w, lk != nil), false
	}
	l.mu.Unlock()
	if !handed {
		unsub()
		return lk, res, false, err
	}
	got := <-w.got // sent right after w left the queue
	if lk == nil && err == nil {
		return got, nil, true, nil
	}
	got.drop()
	return lk, res, false, err
}

// removeLocked takes w out of its queue, wakes the new head (telling it to
// hold off polling if w got the lock), and drops the queue when it is empty.
// It returns what must run after l.mu is released.
func (l *Locker) removeLocked(name string, w *waiter, gotLock bool) func() {
	q := l.queues[name]
	i := slices.Index(q.waiters, w)
	if i < 0 {
		return func() {}
	}
	q.waiters = slices.Delete(q.waiters, i, i+1)
	if len(q.waiters) > 0 {
		if i == 0 {
			q.waiters[0].delay = gotLock
			signal(q.waiters[0].wake)
		}
		return func() {}
	}
	delete(l.queues, name)
	l.nqueues.Store(int64(len(l.queues)))
	if q.subscribed {
		return l.unsubscribeLocked(name)
	}
	return func() {}
}

// nextWaiter picks the waiter a releasing holder of name should hand the lock
// to, or nil to release it to all comers.
func (l *Locker) nextWaiter(name string) *waiter {
	if l.nqueues.Load() == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[name]
	if q == nil || len(q.waiters) == 0 {
		return nil
	}
	if q.chain >= maxChain || q.waiters[0].handing {
		q.chain = 0
		return nil
	}
	q.chain++
	w := q.waiters[0]
	w.handing = true
	return w
}

// handedOver completes a hand-over: lk (nil if it failed) goes to w.
func (l *Locker) handedOver(name string, w *waiter, lk *Lock) {
	l.mu.Lock()
	w.handing = false
	if lk == nil {
		l.mu.Unlock()
		signal(w.wake)
		return
	}
	unsub := l.removeLocked(name, w, true)
	l.mu.Unlock()
	unsub()
	w.got <- lk
	signal(w.wake)
}

// released tells the head of name's queue, if any, to try at once: the lock
// was just released to all comers.
func (l *Locker) released(name string) {
	if l.nqueues.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[name]; q != nil && len(q.waiters) > 0 {
		signal(q.waiters[0].wake)
	}
}
