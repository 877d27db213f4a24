package mutex

import (
	"context"
	"errors"
	"slices"
	"time"
)

// maxChain bounds hand-overs in a row within a Locker (PROTOCOL.md,
// "Contention").
const maxChain = 16

// A passing is how a releaser hands the lock to a local waiter.
type passing uint8

const (
	passLocal        passing = iota // without a round trip if hold.passOn allows, else through Redis
	passUnlessMarked                // through Redis, and only if no waiter marked the lock
)

// A queue holds the goroutines of one Locker that wait for one name. Guarded
// by Locker.mu, as are the waiters' fields but cfg and the channels.
type queue struct {
	waiters    []*waiter // FIFO, never empty; waiters[0], the head, is the only one polling Redis
	chain      int       // hand-overs in a row
	subscribed bool      // to the name's release channel
}

type waiter struct {
	cfg  lockConfig
	wake chan struct{} // "try now": became head, release announced, hand-over failed
	got  chan *Lock    // a lock handed over; sent once, after removal from the queue
	// handing: a releaser is handing this waiter the lock; it may not leave.
	handing bool
	delay   bool  // became head because its predecessor got the lock
	fail    error // ends the wait: another waiter found Redis unreachable
	// yieldTill: after a yielded hand-over, wake-ups before it do not count.
	yieldTill time.Time
	// recheck asks a gated waiter to try although not the head (declined);
	// rechecked bounds that to once per waiter, so a flipping gate cannot
	// set off a storm of attempts.
	gated, recheck, rechecked bool
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Waiters returns how many Lock and LockWith calls of this Locker wait for
// name now.
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

// wait queues up and polls Redis while at the head; primed: the caller's
// attempt found the lock held with pttl left and stands for the first.
func (l *Locker) wait(ctx context.Context, name string, cfg lockConfig, call *Call, primed bool, pttl time.Duration) outcome {
	s := waitState{l: l, name: name, cfg: cfg, call: call, primed: primed, pttl: pttl}
	s.w = l.enqueue(name, cfg, call)
	defer s.stopTimer()
	for {
		t := l.headOf(name, s.w)
		if !t.queued {
			// Handed the lock; a stale wake-up came before it.
			return outcome{lk: <-s.w.got, handed: true}
		}
		pause, o, end := s.step(ctx, t)
		if end {
			return o
		}
		if o, end := s.sleep(ctx, pause); end {
			return o
		}
	}
}

// An outcome is how a wait ended. handed: by a local holder, so the
// fragment has not run for it.
type outcome struct {
	lk     *Lock
	res    any
	handed bool
	err    error
}

type waitState struct {
	l      *Locker
	name   string
	cfg    lockConfig
	call   *Call
	w      *waiter
	primed bool          // the caller's attempt stands for the head's first one
	pttl   time.Duration // the lease that attempt found left
	timer  *time.Timer
}

// atOnce: the next step follows at once; noTick: wait for events only.
const (
	atOnce = time.Duration(0)
	noTick = time.Duration(-1)
)

func (l *Locker) enqueue(name string, cfg lockConfig, call *Call) *waiter {
	w := &waiter{cfg: cfg, wake: make(chan struct{}, 1), got: make(chan *Lock, 1), gated: call != nil && call.Fragment.gate}
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[name]
	if q == nil {
		q = &queue{}
		l.queues[name] = q
		l.nqueues.Store(int64(len(l.queues)))
	}
	q.waiters = append(q.waiters, w)
	return w
}

// step decides what the waiter does on its turn: hold off, listen, or try.
func (s *waitState) step(ctx context.Context, t turn) (pause time.Duration, o outcome, end bool) {
	primed := s.primed
	s.primed = false // the caller's attempt stands for the first turn only
	switch {
	case t.fail != nil:
		return 0, s.leave(nil, nil, t.fail), true
	case t.holdOff > 0:
		return t.holdOff, o, false
	case t.head && primed:
		return s.listen(ctx, s.pttl), o, false
	case t.head || t.recheck:
		return s.try(ctx, t.head)
	}
	return noTick, o, false
}

// listen subscribes to the name's releases if it can, then asks for one
// more attempt at once: a release before the subscription went unheard.
func (s *waitState) listen(ctx context.Context, pttl time.Duration) time.Duration {
	if s.l.subscribe(ctx, s.name) {
		return atOnce
	}
	return s.l.nextWait(pttl)
}

// try makes an attempt: a head's, or a recheck's (see declined).
func (s *waitState) try(ctx context.Context, head bool) (time.Duration, outcome, bool) {
	lk, pttl, res, err := s.l.take(ctx, s.name, s.cfg, s.call, poll)
	switch {
	case err == nil:
		return 0, s.leave(lk, res, nil), true
	case errors.Is(err, ErrDeclined):
		return 0, s.leave(nil, res, err), true
	case ctx.Err() != nil:
		return 0, s.leave(nil, nil, errors.Join(ErrNotObtained, ctx.Err())), true
	case !errors.Is(err, ErrLocked):
		if errors.Is(err, ErrUnreachable) {
			s.l.failWaiters(s.name, s.w, err)
		}
		return 0, s.leave(nil, nil, err), true
	case !head:
		return noTick, outcome{}, false
	}
	return s.listen(ctx, pttl), outcome{}, false
}

func (s *waitState) sleep(ctx context.Context, pause time.Duration) (outcome, bool) {
	var tick <-chan time.Time
	if pause >= 0 {
		if s.timer == nil {
			s.timer = time.NewTimer(pause)
		} else {
			s.timer.Reset(pause)
		}
		tick = s.timer.C
	}
	select {
	case <-ctx.Done():
		return s.leave(nil, nil, errors.Join(ErrNotObtained, ctx.Err())), true
	case lk := <-s.w.got:
		return outcome{lk: lk, handed: true}, true
	case <-s.w.wake:
	case <-tick:
	}
	return outcome{}, false
}

func (s *waitState) stopTimer() {
	if s.timer != nil {
		s.timer.Stop()
	}
}

// A turn is what a waiter learns when it wakes (headOf).
type turn struct {
	queued  bool          // still queued; if not, a lock was handed to it
	head    bool          // it heads its queue
	holdOff time.Duration // do not poll for this long (head only; see headOf)
	recheck bool          // make one attempt although not the head (see declined)
	fail    error         // end the wait with this error (failWaiters)
}

func (l *Locker) headOf(name string, w *waiter) turn {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[name]
	if q == nil || !slices.Contains(q.waiters, w) {
		return turn{}
	}
	if w.handing {
		return turn{queued: true}
	}
	// A failed waiter's turn carries fail, which step reads first.
	t := turn{queued: true, head: q.waiters[0] == w, recheck: w.recheck, fail: w.fail}
	w.recheck = false
	if !t.head {
		return t
	}
	t.holdOff = max(time.Until(w.yieldTill), 0) // a hand-over to it yielded
	if w.delay {
		// The waiter before w just got the lock: polling now would fail.
		t.holdOff, w.delay = l.nextWait(-1), false
	}
	return t
}

// declined wakes every gated waiter of name for one attempt of its own: a
// gate just declined, likely for them too, and each learns it in parallel.
func (l *Locker) declined(name string) {
	l.eachWaiter(name, func(w *waiter) {
		if w.gated && !w.rechecked {
			w.recheck, w.rechecked = true, true
			signal(w.wake)
		}
	})
}

func (l *Locker) eachWaiter(name string, f func(*waiter)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[name]; q != nil {
		for _, w := range q.waiters {
			f(w)
		}
	}
}

// failWaiters ends the wait of every waiter of name but from with err (an
// unreachable Redis), except one being handed the lock.
func (l *Locker) failWaiters(name string, from *waiter, err error) {
	l.eachWaiter(name, func(w *waiter) {
		if w != from && !w.handing && w.fail == nil {
			w.fail = err
			signal(w.wake)
		}
	})
}

// leave takes the waiter out of its queue and returns the outcome of lk, res
// and err, which has a lock or an error: a lock handed to it meanwhile is
// dropped.
func (s *waitState) leave(lk *Lock, res any, err error) outcome {
	l, w := s.l, s.w
	l.mu.Lock()
	for w.handing {
		l.mu.Unlock()
		<-w.wake // handedOver signals or sends on got: both wake us
		l.mu.Lock()
	}
	var unsub func() // nil: w was handed a lock, and left the queue
	if q := l.queues[s.name]; q != nil && slices.Contains(q.waiters, w) {
		unsub = l.removeLocked(s.name, w, lk != nil)
	}
	l.mu.Unlock()
	if unsub != nil {
		unsub()
	} else {
		got := <-w.got // sent right after w left the queue
		got.drop()
	}
	return outcome{lk: lk, res: res, err: err}
}

// removeLocked takes w out of its queue (it is queued: leave checks, and a
// waiter being handed the lock stays until handedOver), wakes the new head,
// and drops an empty queue. It returns what must run after l.mu is released.
func (l *Locker) removeLocked(name string, w *waiter, gotLock bool) func() {
	q := l.queues[name]
	i := slices.Index(q.waiters, w)
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
	if q.subscribed { // then l.sub is open, with the name's channel
		return l.dropChannelLocked(l.channel(name))
	}
	return func() {}
}

// nextWaiter picks the waiter a releasing holder hands the lock to, and how,
// or nil. After maxChain hand-overs it is passUnlessMarked if mayYield (a
// fragment's release cannot yield: its reply is the fragment's), else nil.
func (l *Locker) nextWaiter(name string, mayYield bool) (*waiter, passing) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[name]
	if q == nil || q.waiters[0].handing {
		return nil, passLocal
	}
	pass := passLocal
	if q.chain++; q.chain > maxChain {
		q.chain = 0
		if !mayYield {
			return nil, passLocal
		}
		pass = passUnlessMarked
	}
	w := q.waiters[0]
	w.handing = true
	return w, pass
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

// yielded makes w hold off a retry interval, so that the other Locker's
// waiter gets its turn.
func (l *Locker) yielded(w *waiter) {
	l.mu.Lock()
	w.handing, w.yieldTill = false, time.Now().Add(l.nextWait(-1))
	l.mu.Unlock()
	signal(w.wake)
}

func (l *Locker) wakeHeadLocked(name string) {
	if q := l.queues[name]; q != nil {
		signal(q.waiters[0].wake)
	}
}
