package funnel

import (
	"context"
	"errors"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/mutex"
)

// A leader runs one batch (see batch.go): it takes the key's lock with a
// gate that reads the state, decides the batch's calls on that state, writes
// what the admitted ones took and releases the lock in one script, and gives
// each call its outcome. It holds what the Redis commands take; the calls
// are passed apart (sealed), so that escape analysis keeps them on the
// stack of a call that leads alone.
type leader struct {
	lim *Limiter
	c   call
	n   int64 // the leader's own units
	// sent is taken before Redis reads its clock: a denial's wait counts
	// from it, for every call of the batch (see denyCache); epoch is the
	// deny cache's at that time.
	sent  time.Time
	epoch uint64
	// recv is when the last reply of a lock attempt came: with the server
	// time it carried, a sample of the server's clock (serverclock.go).
	recv time.Time
	// late is set when the last attempt ended in a write refused as late:
	// the server's clock, as sampled, ran past a call's deadline.
	late bool
	// lock is the key's lock, for the one-round-trip admission (admit.lua);
	// empty where that admission does not apply.
	lock string
	// seen is the key's state as this Limiter last saw it (statecache.go),
	// nil when not known or not cached; exp is what the attempt's gate was
	// sent for it (returning.lua), nil for another gate; nonce is the
	// attempt's admission's.
	seen  []string
	exp   []expectation
	nonce string
	// alone is set when the gate admitted the leader's call alone while
	// others joined its batch; carried once the leader leads them on.
	alone, carried bool
	// cache: the state cache keeps what the calls read and write.
	cache bool
	// optimistic: the key is crowded, its batches commit without the
	// lock (commitfree.go); next is commit.lua's reply that found the
	// state changed, for the next read; lockKey is the key's lock.
	optimistic bool
	next       any
	lockKey    string
	lost       int // commits that found the state changed
}

// A reading is a gate's reply: the state, the end of the key's penalty box
// (0: not in it), and whether the gate declined the lock (a rule has no
// room now, or the key is in the box): then nothing can be written, and
// every call of the batch is denied. Deciding the calls updates its levels:
// they become the state to write.
type reading struct {
	snapshot
	till     int64
	declined bool
	clock    sample // the server's clock, from this very reply
}

// lead runs batch b, whose leader asks n units: the lock and the read, the
// decisions of its calls, one write, and each call's outcome. A key with no
// state and a free lock admits the leader's units in the read's round trip
// (admit.lua); the others of the batch then run again.
func (lim *Limiter) lead(ctx context.Context, c call, k batchKey, b *batch, n int64) {
	var ws sealed
	defer func() { ws.wake() }()
	l := lim.newLeader(c, n)
	if l.optimistic { // read afresh (commitfree.go), in turn
		done, err := lim.turns.take(ctx, batchKey{c.key, c.set})
		if err != nil {
			ws = lim.batches.seal(k, b)
			ws[0].err = err
			ws.rerunOthers()
			return
		}
		defer done()
	}
	for i := 0; i < maxCommits; i++ {
		if l.next != nil {
			i-- // decided again on what commit.lua returned: bounded by maxLost
		}
		lk, res, err := l.acquire(ctx)
		l.recv = time.Now()
		if ws == nil {
			// The first reply seals the batch: the calls that arrive later
			// form the next one.
			ws = lim.batches.seal(k, b)
		}
		l.late = false
		again := l.settle(ctx, ws, lk, res, err)
		if !again && l.alone {
			ws, again = l.carryOn(ws), true
		}
		if !again {
			return
		}
	}
	if l.late {
		// Near their deadline, under a sample of the server's clock that
		// keeps coming late (a busy host reads replies late): the calls
		// with a deadline end as out of time, not in a conflict.
		ws.failLate()
		return
	}
	ws.failAll(ErrConflict)
}

// newLeader is the leader of call c of n units: the lock its gate takes
// ("" for none: a Limiter of uniform cost, a calendar rule), and, where the
// state cache applies, the state it remembers, or none, to be read afresh
// in turn (optimistic).
func (lim *Limiter) newLeader(c call, n int64) leader {
	l := leader{lim: lim, c: c, n: n, sent: time.Now(), epoch: lim.denials.epoch()}
	if !lim.uniform && !c.set.calendar {
		l.lock = c.lock
		if l.lock == "" {
			l.lock = lim.locker.LockKey(c.name)
		}
	}
	if l.cache = l.lock != "" && c.set.funnels && lim.states != nil; l.cache {
		l.lockKey = l.lock
		l.seen, l.optimistic = lim.states.lookup(c.key, c.set)
		if l.optimistic {
			l.seen = nil
		}
	}
	return l
}

// carryOn makes the leader, whose call its gate admitted alone (admit.lua
// or returning.lua), lead the other calls of its batch on, and returns
// them: they came while its gate ran, and rather than each running again
// (joining batches whose leaders' gates would admit them alone too, on a
// hot key), they share one lock hold. It reads through read.lua, which
// admits nothing alone, under the leader's context: if that ends first,
// they run again.
func (l *leader) carryOn(ws sealed) sealed {
	l.alone, l.carried = false, true
	l.lock, l.seen, l.exp = "", nil, nil
	l.optimistic = l.cache
	rest := ws[1:]
	l.n = rest[0].n
	l.sent, l.epoch = time.Now(), l.lim.denials.epoch()
	return rest
}

// settle decides the calls ws on the reply of a lock attempt (lk, res, err)
// and commits what they took. It reports whether the lease lapsed before the
// commit: nothing was written, and every call is decided again on fresh
// state.
func (l *leader) settle(ctx context.Context, ws sealed, lk *mutex.Lock, res any, err error) (again bool) {
	declined := errors.Is(err, mutex.ErrDeclined)
	if now, verdict, how := admitted(declined, res); verdict != "" {
		s := l.lim.clock.sampled(now, l.recv)
		switch {
		case verdict == "admitted":
			ws[0].res = l.admitAlone(now, how, len(ws) > 1)
			l.alone = len(ws) > 1 // the others: see carryOn
			return false
		case !outOfTime(ws[0].deadline):
			// "late" with time left: the sample was off (the server's
			// clock stepped forward). Nothing was written; the reply's
			// clock bounds the next attempt.
			l.lim.clock.keep(s)
			l.late = true
			return true
		default: // "late": nothing was written
			ws[0].err = errLate
		}
		ws.rerunOthers()
		return false
	}
	if err != nil && !declined {
		l.failed(ctx, ws, err)
		return false
	}
	r, err := l.lim.read(l.c, res)
	if err != nil {
		_, _ = l.lim.unlock(ctx, lk, nil)
		ws.failAll(err)
		return false
	}
	r.declined = declined
	r.clock = l.lim.clock.sampled(r.now, l.recv)
	l.saw(res)
	taken := l.decide(ws, r)
	if taken == 0 || ws[0].err != nil {
		_, _ = l.lim.unlock(ctx, lk, nil) // nil when declined
		if ws[0].err != nil && taken > 0 {
			// The leader has no time left to write: the others run again.
			ws.rerunOthers()
			return false
		}
		l.cacheDenials(ws)
		return false
	}
	return l.commit(ctx, ws, lk, r)
}

// failed answers the calls ws after the lock attempt failed with err. Only
// the end of the leader's own time is the leader's alone: then the others
// run again, each under its own context. Any other error (a refusal, a
// connection lost, an error reply of Redis) is what the others, asking the
// same at the same time, would hear one after another: they get it too,
// and took nothing.
func (l *leader) failed(ctx context.Context, ws sealed, err error) {
	err = corrupt(err)
	switch {
	case errors.Is(err, ErrUnreachable) || !ranOutOfTime(ctx, err):
		ws.failAll(err)
	case l.carried:
		ws.rerunAll() // the leader's own call is decided; they run again
	default:
		ws[0].err = err
		ws.rerunOthers()
	}
}

// ranOutOfTime reports whether err, a leader's, may have come from the end
// of its own time: its context ended, or a time-out (the client's, which
// with ContextTimeoutEnabled is the context's deadline).
func ranOutOfTime(ctx context.Context, err error) bool {
	var timeout interface{ Timeout() bool }
	return ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.As(err, &timeout) && timeout.Timeout()
}

// acquire tries the key's lock with a gate that reads the state, and waits
// for it if another holds it and the state does not deny. The gate is the
// penalty box's (penalty.lua) when there is one, else the one-round-trip
// admission's (admit.lua) unless WithUniformCost or a calendar rule, else
// read.lua; each
// attempt gets its own (admit.lua's nonce is new).
func (l *leader) acquire(ctx context.Context) (*mutex.Lock, any, error) {
	if l.optimistic {
		return l.readFree(ctx)
	}
	lim := l.lim
	// Built here, not returned by a function: its slices stay on the stack.
	var gate mutex.Call
	switch {
	case lim.penalty != nil:
		gate = mutex.Call{Fragment: penaltyGate, Keys: []string{l.c.key}, Args: l.c.penalized(lim.penalty, "1")}
	case l.lock != "": // neither WithUniformCost nor a calendar rule
		gate = l.admitGate(ctx)
	default:
		gate = l.c.read(readGate)
	}
	lk, res, err := lim.locker.TryLockWith(ctx, l.c.name, gate, lim.hold...)
	if errors.Is(err, mutex.ErrLocked) {
		lk, res, err = lim.locker.LockWith(ctx, l.c.name, gate, lim.hold...)
	}
	return lk, res, err
}

// admitGate returns the gate of an admission attempt: returning.lua's when
// the key's state was seen and the call can be decided on it there, else
// admit.lua's.
func (l *leader) admitGate(ctx context.Context) mutex.Call {
	clock := &l.lim.clock
	d, ok := ctx.Deadline()
	deadline := clock.admitDeadline(d, ok, l.sent)
	l.nonce, l.exp = newNonce(), nil
	s, fresh := clock.latest(l.sent)
	if l.seen == nil || !fresh || deadline == throughLock {
		return l.c.admit(l.n, l.lock, deadline, l.nonce)
	}
	// The server's clock reads at least est when the gate runs: the time
	// of the latest reply, which a clock that stands still (a test's)
	// keeps too.
	est := s.offset + s.at
	gate, exp, ok := l.c.returning(l.n, l.lock, l.seen, est, deadline, l.nonce)
	if !ok {
		return l.c.admit(l.n, l.lock, deadline, l.nonce)
	}
	l.exp = exp
	return gate
}

// admitted returns the verdict of admit.lua or returning.lua in a declined
// gate's result, "admitted" (the call was admitted) or "late" (it ran past
// the call's deadline and wrote nothing), the server time it ran at, and
// how returning.lua wrote each rule; or "" for another result.
func admitted(declined bool, res any) (int64, string, string) {
	if !declined {
		return 0, "", ""
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != 2 && len(arr) != 3 {
		return 0, "", ""
	}
	now, ok := arr[0].(int64)
	verdict, _ := arr[1].(string)
	if !ok || verdict != "admitted" && verdict != "late" {
		return 0, "", ""
	}
	var how string
	if len(arr) == 3 {
		how, _ = arr[2].(string)
	}
	return now, verdict, how
}

// admitAlone returns the leader's admission by its gate at server time now:
// on an empty state (admit.lua), or on the state seen (returning.lua, which
// wrote each rule as how says). The state cache keeps what the gate wrote.
func (l *leader) admitAlone(now int64, how string, others bool) Result {
	rules := l.c.rules
	var levels []level
	var values []string
	if l.exp != nil {
		levels, values = l.c.returned(l.seen, l.exp, how, now, l.nonce)
	} else if l.cache {
		values = make([]string, len(rules))
		for i := range rules {
			fresh, _ := l.c.fresh(i, l.n)
			values[i] = stamped(fresh, now, l.nonce)
		}
	}
	if l.cache {
		l.lim.states.store(l.c.key, l.c.set, values, crowdingOf(others))
	}
	d := decide(rules, levels, now, l.n)
	return d.result(rules)
}

// saw keeps the values of a gate's read reply, {now, value...}, as the
// state seen: for the next attempt's gate, and in the state cache.
func (l *leader) saw(res any) {
	if !l.cache {
		return
	}
	arr, _ := res.([]any)
	if len(arr) != len(l.c.rules)+1 {
		return
	}
	values := make([]string, len(l.c.rules))
	for i := range values {
		values[i], _ = arr[i+1].(string)
	}
	l.seen = values
	l.lim.states.store(l.c.key, l.c.set, values, keepCrowding)
}

// read parses the result of c's gate, or of Peek's script, after proceed.
func (lim *Limiter) read(c call, res any) (reading, error) {
	res, till := lim.unbox(c, res)
	snap, err := parseRead(c.rules, res)
	return reading{snapshot: snap, till: till}, err
}

// decide decides the calls ws in arrival order on r, each seeing the units
// the calls before it took, and returns how many it admitted. A call that
// would be admitted but has no time left for the write (its write would be
// refused) is answered errLate instead, and takes nothing.
func (l *leader) decide(ws sealed, r reading) int {
	taken := 0
	for _, w := range ws {
		if w.done != nil && w.gone.Load() {
			continue // its caller left before its turn: nothing taken for it
		}
		if l.take(w, r) {
			taken++
		} else if w.done != nil && w.err != nil {
			w.gone.Store(true) // answered errLate: not decided again
		}
	}
	return taken
}

// take decides w on r's levels and, if it is admitted, takes its units.
func (l *leader) take(w *waiter, r reading) bool {
	rules := l.c.rules
	d := decide(rules, r.levels, r.now, w.n)
	switch {
	case r.till > 0: // in the penalty box
		w.res = boxed(d, rules, r.now, r.till)
		return false
	case r.declined || !d.allowed:
		d.allowed = false
		d.retry = max(d.retry, 1) // never "retry now" on a denial
		w.res = d.result(rules)
		return false
	}
	w.until = noDeadline
	if !w.deadline.IsZero() {
		w.until = max(r.clock.until(l.lim.clock.local(w.deadline, false)), 1)
		if w.until <= r.now {
			w.res, w.err = Result{}, errLate
			return false
		}
	}
	for j := range r.levels {
		r.levels[j] = d.level(j)
	}
	w.res = d.result(rules)
	return true
}

// commit writes r's levels as the decisions left them and releases the
// lock. It reports whether the lease lapsed first: then nothing was written.
func (l *leader) commit(ctx context.Context, ws sealed, lk *mutex.Lock, r reading) (again bool) {
	fills, ats := make([]int64, len(r.levels)), make([]int64, len(r.levels))
	var logs [][]int64
	for j, lv := range r.levels {
		fills[j], ats[j] = lv.fill, lv.at
		if lv.log != nil {
			if logs == nil {
				logs = make([][]int64, len(r.levels))
			}
			logs[j] = *lv.log
		}
	}
	args := writeArgs(l.c.rules, fills, ats, logs, r.now, ws.deadline())
	if lk == nil {
		return l.commitFree(ctx, ws, args)
	}
	if ctxcall.Ended(ctx) != nil {
		// The leader's time ran out before its commit (a reply that came
		// late): nothing is written, and the lock is released without it.
		_, _ = l.lim.unlock(ctx, lk, nil)
		return ws.late()
	}
	reply, err := l.lim.unlock(ctx, lk, &mutex.Call{Fragment: writeBack, Keys: []string{l.c.key}, Args: args})
	switch {
	case errors.Is(err, mutex.ErrNotHeld):
		return true
	case err == nil && isLate(reply):
		l.lim.clock.keep(l.lim.clock.sampled(-reply.(int64), time.Now()))
		l.late = true
		return ws.late()
	case err != nil:
		// The write may or may not have happened: the admitted calls cannot
		// know; a denial stands (it took nothing).
		ws.failAdmitted(err)
	default:
		l.wrote(ws, args)
		l.cacheDenials(ws)
	}
	return false
}

// wrote keeps the values of a commit, write.lua's args (field, value pairs
// after two numbers), in the state cache.
func (l *leader) wrote(ws sealed, args []any) {
	if !l.cache {
		return
	}
	values := make([]string, len(l.c.rules))
	for i := range values {
		values[i], _ = args[3+2*i].(string)
	}
	l.lim.states.store(l.c.key, l.c.set, values, crowdingOf(len(ws) > 1))
}

// crowdingOf marks a key whose admission had others waiting as crowded.
func crowdingOf(others bool) crowding {
	if others {
		return crowded
	}
	return calm
}

// cacheDenials remembers the denials of ws in the deny cache (store keeps
// only denials with a wait).
func (l *leader) cacheDenials(ws sealed) {
	if l.lim.denials == nil {
		return
	}
	for _, w := range ws {
		if w.err == nil {
			l.lim.denials.store(l.c.key, l.c.set, w.n, l.sent, l.epoch, w.res)
		}
	}
}
