package funnel

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/mutex"
)

// The concurrent admissions of one key with one rule set in one Limiter
// form a batch, decided in arrival order on one read and written in one
// script by the call that leads it (DESIGN.md, "Hot keys").

// A waiter is one call in a batch.
type waiter struct {
	n        int64
	done     chan struct{} // closed once res, err or again is set; nil for the leader
	deadline time.Time     // the call's context's (zero: none)
	until    int64         // once admitted: when (server µs) its write is refused; MaxInt64: never
	res      Result
	err      error
	again    bool        // not decided, for a reason of its leader's: it runs again
	gone     atomic.Bool // its caller left: nothing is decided for it
}

type batchKey struct {
	key string
	set *ruleSet
}

// A batch is the calls of one lock hold, in arrival order. It holds its
// leader's waiter, so that a call that leads alone allocates once.
type batch struct {
	waiters []*waiter
	first   [1]*waiter
	leader  waiter
}

type batches struct {
	mu   sync.Mutex
	open map[batchKey]*batch // made by New
}

// join adds a call of n units with deadline d to k's open batch, or opens
// one that it leads (lead is true).
func (bs *batches) join(k batchKey, n int64, d time.Time) (b *batch, w *waiter, lead bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b := bs.open[k]; b != nil {
		w := &waiter{n: n, deadline: d, done: make(chan struct{})}
		b.waiters = append(b.waiters, w)
		return b, w, false
	}
	b = newBatch(n, d)
	bs.open[k] = b
	return b, &b.leader, true
}

func newBatch(n int64, d time.Time) *batch {
	b := &batch{leader: waiter{n: n, deadline: d}}
	b.first[0] = &b.leader
	b.waiters = b.first[:]
	return b
}

// seal closes b to new calls and returns its calls.
func (bs *batches) seal(k batchKey, b *batch) sealed {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	delete(bs.open, k) // b's, while it is open: a key's next batch opens after this
	return b.waiters
}

// sealed is the calls of a closed batch, the leader's first.
type sealed []*waiter

func (ws sealed) failLeader(err error) {
	ws[0].err = err
	ws[1:].rerunAll()
}

func (ws sealed) rerunAll() {
	for _, w := range ws {
		w.again = true
	}
}

func (ws sealed) failAll(err error) {
	for _, w := range ws {
		w.err = err
	}
}

// giveUp answers the calls of a batch out of attempts ErrConflict; if the
// last write came late (a clock sample that keeps coming late), those with
// a deadline errLate: out of time, not a conflict.
func (ws sealed) giveUp(late bool) {
	for _, w := range ws {
		w.err = ErrConflict
		if late && !w.deadline.IsZero() {
			w.err = errLate
		}
	}
}

// failAdmitted answers the admitted calls with err: their write may or may
// not have run. A denial stands: it took nothing.
func (ws sealed) failAdmitted(err error) {
	for _, w := range ws {
		if w.res.Allowed {
			w.err, w.res = err, Result{}
		}
	}
}

// deadline is the earliest server time from which the write of an admitted
// call is refused (noDeadline when none has one).
func (ws sealed) deadline() int64 {
	d := int64(math.MaxInt64)
	for _, w := range ws {
		if w.res.Allowed && w.err == nil {
			d = min(d, w.until)
		}
	}
	if d == math.MaxInt64 {
		return noDeadline
	}
	return d
}

// late answers errLate the admitted calls out of time after a write refused
// as late (nothing was written). If the leader's is one, the others run
// again; else the rest of the batch is decided again (again is true).
func (ws sealed) late() (again bool) {
	for i, w := range ws {
		if !w.res.Allowed || !outOfTime(w.deadline) {
			continue
		}
		w.res, w.err = Result{}, errLate
		if i == 0 {
			ws.failLeader(errLate)
			return false
		}
		w.gone.Store(true) // not decided again
	}
	return true
}

func (ws sealed) wake() {
	for _, w := range ws {
		if w.done != nil {
			close(w.done)
		}
	}
}

// maxReruns bounds how often a call runs again because its leader ran out
// of time; then it leads alone. A rerun is no lost commit: it never ends in
// ErrConflict.
const maxReruns = 8

func (lim *Limiter) allowBatched(ctx context.Context, c call, n int64) (Result, error) {
	k := batchKey{c.key, c.set}
	d, _ := ctx.Deadline()
	for range maxReruns {
		b, w, lead := lim.batches.join(k, n, d)
		if lead {
			lim.lead(ctx, c, k, b, n)
		} else if err := w.wait(ctx); err != nil {
			return Result{}, err
		}
		if !w.again {
			return outcome(ctx, w.res, w.err)
		}
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		if outOfTime(d) { // no time left for a write of its own
			return outcome(ctx, Result{}, errLate)
		}
	}
	return lim.allowAlone(ctx, c, n)
}

// allowAlone leads a batch of this call alone; a leader never runs again.
func (lim *Limiter) allowAlone(ctx context.Context, c call, n int64) (Result, error) {
	d, _ := ctx.Deadline()
	b := newBatch(n, d)
	lim.lead(ctx, c, batchKey{}, b, n)
	return outcome(ctx, b.leader.res, b.leader.err)
}

// wait waits until w's batch decided it or ctx ends: then w leaves its batch
// and wait returns ctx's error, unless the batch decided w meanwhile.
func (w *waiter) wait(ctx context.Context) error {
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
	}
	w.gone.Store(true)
	select {
	case <-w.done:
		return nil
	default:
		return ctx.Err()
	}
}

// A leader runs one batch. The calls are passed apart (sealed), so that
// escape analysis keeps them on the stack of a call that leads alone.
type leader struct {
	lim *Limiter
	c   call
	n   int64 // the units of the call its gate is sent for
	// sent is taken before Redis reads its clock (a cached denial's wait
	// counts from it); epoch is the deny cache's then.
	sent  time.Time
	epoch uint64
	recv  time.Time // when the last reply came: a sample of the server's clock
	late  bool      // the last write was refused as late
	// lock is the key's lock for a one-script admission (gate.go), "" for
	// none; seen is the state cache's values, exp what returning.lua was
	// sent for them, nonce the gate's.
	lock  string
	seen  []string
	exp   []expectation
	nonce string
	// alone: the gate admitted the leader's call alone while others
	// joined; carried: the leader leads them on (carryOn).
	alone, carried bool
	cache          bool // the state cache keeps what the calls read and write
	// optimistic: the key is crowded (crowded.go); next is commit.lua's
	// reply for the next read; lost counts commits that found the state
	// changed.
	optimistic bool
	next       any
	lost       int
}

// lead runs batch b, whose leader asks n units: its attempts, each call's
// decision, one write, and each call's outcome.
func (lim *Limiter) lead(ctx context.Context, c call, k batchKey, b *batch, n int64) {
	var ws, all sealed // all: as sealed, every call woken however ws narrows
	defer func() { all.wake() }()
	l := lim.newLeader(c, n)
	if l.optimistic { // crowded batches of one key read and commit in turn
		done, err := lim.turns.take(ctx, batchKey{c.key, c.set})
		if err != nil {
			all = lim.batches.seal(k, b)
			all.failLeader(err)
			return
		}
		defer done()
	}
	for i := 0; i < maxCommits; i++ {
		if l.next != nil {
			i-- // decided again on commit.lua's reply: bounded by maxLost
		}
		lk, res, err := l.attempt(ctx)
		l.recv = time.Now()
		if ws == nil { // the first reply seals the batch
			ws = lim.batches.seal(k, b)
			all = ws
		}
		l.late = false
		if again := l.settle(ctx, ws, lk, res, err); !again {
			if !l.alone {
				return
			}
			ws = l.carryOn(ws)
		}
	}
	ws.giveUp(l.late)
}

// newLeader is the leader of call c of n units: the lock its one-script
// gate checks ("" for none: WithUniformCost, a calendar rule), and, where
// the state cache applies, the state it holds (a crowded batch reads its own).
func (lim *Limiter) newLeader(c call, n int64) leader {
	l := leader{lim: lim, c: c, n: n}
	l.stamp()
	if !lim.uniform && c.set.admit1 != nil { // admit.lua can write the set's values
		if l.c.lock == "" {
			l.c.lock = lim.locker.LockKey(c.name)
		}
		l.lock = l.c.lock
	}
	if l.cache = l.lock != "" && c.set.funnels && lim.states != nil; l.cache {
		l.seen, l.optimistic = lim.states.lookup(c.key, c.set)
	}
	return l
}

// carryOn makes the leader, whose call its gate admitted alone, lead the
// calls that joined meanwhile on, through read.lua: they share one lock
// hold (or, crowded, one commit) rather than each running again.
func (l *leader) carryOn(ws sealed) sealed {
	l.alone, l.carried = false, true
	l.lock, l.seen, l.exp = "", nil, nil
	l.optimistic = l.cache
	rest := ws[1:]
	l.n = rest[0].n
	l.stamp()
	return rest
}

// stamp sets sent and epoch, before the leader asks Redis.
func (l *leader) stamp() {
	l.sent = time.Now()
	if d := l.lim.denials; d != nil {
		l.epoch = d.forgets.Load()
	}
}

// attempt chooses the batch's path and runs its first round trip: a
// crowded key's read (crowded.go), else a lock attempt gated by the penalty
// box, the one-script admission (gate.go) or read.lua.
func (l *leader) attempt(ctx context.Context) (*mutex.Lock, any, error) {
	if l.optimistic {
		return l.readFree(ctx)
	}
	lim := l.lim
	// Built here, not returned by a function: its slices stay on the stack.
	var gate mutex.Call
	switch {
	case lim.penalty != nil:
		gate = mutex.Call{Fragment: penaltyGate, Keys: []string{l.c.key}, Args: l.c.penalized(lim.penalty, "1")}
	case l.lock != "" && l.cache:
		if res, decided, err := l.oneScript(ctx); decided {
			return nil, res, err
		}
		gate = l.c.read(readGate)
	case l.lock != "":
		gate, _ = l.admitGate(ctx)
	default:
		gate = l.c.read(readGate)
	}
	lk, res, err := lim.locker.TryLockWith(ctx, l.c.name, gate, lim.hold...)
	if errors.Is(err, mutex.ErrLocked) {
		lk, res, err = lim.locker.LockWith(ctx, l.c.name, gate, lim.hold...)
	}
	return lk, res, err
}

// settle answers the calls ws on an attempt's reply and reports whether
// they are decided again: a gate's own admission (gate.go), a failed
// attempt, or a read to decide on and commit (lock.go).
func (l *leader) settle(ctx context.Context, ws sealed, lk *mutex.Lock, res any, err error) (again bool) {
	declined := errors.Is(err, mutex.ErrDeclined)
	if now, verdict, how := admitted(declined, res); verdict != "" {
		return l.settleGate(ws, now, verdict, how)
	}
	if err != nil && !declined {
		l.failed(ctx, ws, err)
		return false
	}
	return l.settleRead(ctx, ws, lk, res, declined)
}

// admitted returns the verdict in a declined gate's result, "admitted" or
// "late", the server time it ran at, and how returning.lua wrote each rule;
// verdict is "" for a result of another shape (a read's: its second item is
// a rule's value, never one of the verdicts).
func admitted(declined bool, res any) (now int64, verdict, how string) {
	arr, _ := res.([]any)
	if !declined || len(arr) < 2 {
		return 0, "", ""
	}
	now, ok := arr[0].(int64)
	if verdict, _ = arr[1].(string); !ok || verdict != "admitted" && verdict != "late" {
		return 0, "", ""
	}
	if len(arr) > 2 {
		how, _ = arr[2].(string)
	}
	return now, verdict, how
}

// failed answers the calls ws after the attempt failed with err. Only the
// end of the leader's own time is its alone: then the others run again.
// Any other error is what they would hear too: they get it.
func (l *leader) failed(ctx context.Context, ws sealed, err error) {
	err = corrupt(err)
	switch {
	case errors.Is(err, ErrUnreachable) || !ranOutOfTime(ctx, err):
		ws.failAll(err)
	case l.carried:
		ws.rerunAll() // the leader's own call is decided
	default:
		ws.failLeader(err)
	}
}

// ranOutOfTime reports whether err may come from the end of ctx's time:
// ctx ended, or a time-out (a client's with ContextTimeoutEnabled).
func ranOutOfTime(ctx context.Context, err error) bool {
	return ctxcall.Ended(ctx) != nil || errors.Is(err, context.Canceled) || ctxcall.TimedOut(err)
}
