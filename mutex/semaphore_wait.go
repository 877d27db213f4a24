package mutex

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Acquire takes n permits, waiting in the semaphore's FIFO queue (shared by
// every process) while they are not free or others wait before it. A
// release grants the head waiters and announces it on Pub/Sub, so a waiter
// wakes holding its permits; it also polls every 1 to 2 retry intervals,
// which keeps its place. A waiter that stops polling (its process died) is
// passed over at most 3 retry intervals after its last poll; a live one
// that polled late queues again at its place. When ctx ends first, Acquire
// leaves the queue (giving back what it was granted meanwhile) and returns
// an error matching both ErrNotObtained and ctx.Err(). A waiter stopped
// past its lease may wake holding a grant whose Done is closed already. n
// must be 1 to Size (ErrInvalid); the options are TryAcquire's. On a quorum
// Locker it tries as TryAcquire does every jittered retry interval.
func (s *Semaphore) Acquire(ctx context.Context, n int64, opts ...Option) (*Permit, error) {
	cfg, err := s.check(ctx, n, opts)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(ErrNotObtained, err)
	}
	return s.dep.semWait(ctx, s, n, cfg)
}

// semWait is Acquire on one Redis: queue up, poll, and wake holding the
// permits a release granted.
func (single) semWait(ctx context.Context, s *Semaphore, n int64, cfg lockConfig) (*Permit, error) {
	w := semWaiter{s: s, tok: newSemToken(), n: n, cfg: cfg, grant: make(chan string, 1)}
	defer w.leave()
	w.listen(ctx, true)
	for pause := time.Duration(0); ; {
		if p, done, err := w.sleep(ctx, pause); done {
			return p, err
		}
		start := time.Now()
		r, err := s.acquireOnce(ctx, w.tok, n, cfg, w.mode())
		switch {
		case err != nil:
			if ctx.Err() != nil {
				err = errors.Join(ErrNotObtained, ctx.Err())
			}
			return nil, err
		case r[0] == semGranted:
			return s.newPermit(w.tok, n, cfg, start, r[1], r[2], r[3]), nil
		}
		w.start, w.now = start, r[1]
		if len(r) > 2 {
			w.seq = r[2]
		}
		switch {
		case w.listen(ctx, false):
			pause = 0 // a grant before the waiter listened went unheard
		case w.subscribed:
			pause = s.pollWait(cfg.ttl)
		default:
			pause = s.l.nextWait(-1) // no grant messages: poll as a lock's waiter does
		}
	}
}

// pollWait is the pause between two polls of a waiter that asks for a
// lease of lease: a retry interval, or a quarter of that lease if shorter
// (a grant whose message was lost is found before its lease is half gone),
// jittered: at most 2 retry intervals, one less than the wait lease.
func (s *Semaphore) pollWait(lease time.Duration) time.Duration {
	return s.l.jittered(min(s.l.retry, lease/4))
}

// mode is the acquire script's mode for the waiter's next poll: "w", or
// "w<seq>" once Redis has queued it at place seq, so that a poll that
// finds it passed over (it polled late) queues it again at that place.
func (w *semWaiter) mode() string {
	if w.seq == 0 {
		return "w"
	}
	return "w" + strconv.FormatInt(w.seq, 10)
}

// A semWaiter is one Acquire in the queue.
type semWaiter struct {
	s          *Semaphore
	tok        string
	n          int64
	cfg        lockConfig
	grant      chan string // "<lease end>:<fence>" from the grants' channel
	subscribed bool
	start      time.Time // when the last poll was sent,
	now        int64     // and the server's time in its reply
	seq        int64     // its place in the queue (0 until Redis queued it)
}

// sleep waits for the pause, a grant or the end of ctx; done reports that
// Acquire returns p and err.
func (w *semWaiter) sleep(ctx context.Context, pause time.Duration) (p *Permit, done bool, err error) {
	if pause <= 0 && ctx.Err() == nil {
		return nil, false, nil
	}
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		w.s.cancel(ctx, w.tok)
		return nil, true, errors.Join(ErrNotObtained, ctx.Err())
	case g := <-w.grant:
		// A grant the replicas must acknowledge is confirmed by the poll
		// that follows, with its WAIT (or given back); one that had ended
		// by the last poll is an earlier one, which the server took back
		// (the waiter was stopped past its lease, and queued again): poll.
		if ends, fence, ok := parseGrant(g); ok && ends > w.now && w.s.l.acks == 0 {
			return w.s.newPermit(w.tok, w.n, w.cfg, w.start, w.now, ends, fence), true, nil
		}
	case <-t.C:
	}
	return nil, false, nil
}

// parseGrant reads one grant "<lease end>:<fence>".
func parseGrant(g string) (ends, fence int64, ok bool) {
	e, f, _ := strings.Cut(g, ":")
	ends, err1 := strconv.ParseInt(e, 10, 64)
	fence, err2 := strconv.ParseInt(f, 10, 64)
	return ends, fence, err1 == nil && err2 == nil
}

// listen makes the waiter hear its grants on the Locker's shared Pub/Sub
// connection, once, and waits while ctx allows for the channel's
// SUBSCRIBE (listener.ready). Before the first poll (first) it does so only
// when another waiter of the Locker has opened the channel: every grant of
// the token follows that poll, so none goes unheard (a contended hand-off
// stays one release and one Pub/Sub message). After a poll it opens the
// channel if need be, and reports true: a grant made between that poll and
// now went unheard, so the waiter must poll again.
func (w *semWaiter) listen(ctx context.Context, first bool) bool {
	l, ch := w.s.l, w.s.channel
	if w.subscribed || !l.notify {
		return false
	}
	l.mu.Lock()
	if first && (l.sub == nil || l.sub.chans[ch] == nil) {
		l.mu.Unlock()
		return false
	}
	w.subscribed = true
	c, fresh := l.listenLocked(ctx, ch)
	c.grants[w.tok] = w.grant
	sub := l.sub
	l.mu.Unlock()
	if fresh {
		sub.subscribe(ctx, ch, c.ready)
		return true
	}
	select {
	case <-c.ready:
	case <-ctx.Done():
	}
	return true
}

func (w *semWaiter) leave() {
	if !w.subscribed {
		return
	}
	l := w.s.l
	l.mu.Lock()
	c := l.sub.chans[w.s.channel] // kept while it has grants to deliver
	delete(c.grants, w.tok)
	after := func() {}
	if len(c.grants) == 0 {
		after = l.dropChannelLocked(w.s.channel)
	}
	l.mu.Unlock()
	after()
}

// deliverGrants hands each grant of a message on a semaphore's channel to
// its waiter, if it is one of this Locker's; Locker.mu is held.
func deliverGrants(waits map[string]chan string, payload string) {
	for g := range strings.SplitSeq(payload, ",") {
		tok, grant, _ := strings.Cut(g, ":")
		if c, ok := waits[tok]; ok {
			select {
			case c <- grant:
			default:
			}
		}
	}
}
