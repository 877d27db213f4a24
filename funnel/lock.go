package funnel

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/funnelguard/funnelguard/mutex"
)

// A reading is a read's reply: the state, the end of the key's penalty box
// (0: not in it), and whether the gate declined the lock: then every call
// is denied. Deciding the calls updates its levels to the state to write.
type reading struct {
	now      int64
	levels   []level
	till     int64
	declined bool
	clock    sample // the server's clock, from this reply
}

// settleRead decides the calls ws on a read's reply and commits what they
// took; it returns them when nothing was written and they are decided anew.
func (l *leader) settleRead(ctx context.Context, ws sealed, lk *mutex.Lock, res any, declined bool) sealed {
	r, err := parseRead(l.c.set.rules, res)
	if err != nil {
		_, _ = l.lim.unlock(ctx, lk, nil)
		ws.failAll(err)
		return nil
	}
	r.declined = declined
	r.clock = l.lim.clock.sampled(r.now, l.recv)
	if l.cache {
		l.saw(res)
	}
	taken := 0 // in arrival order, each call seeing the units taken before it
	for _, w := range ws {
		if !w.gone.Load() && l.take(w, r) { // gone: its caller left, or it was answered
			taken++
		}
	}
	if taken > 0 && ws[0].err == nil {
		return l.commit(ctx, ws, lk, r)
	}
	_, _ = l.lim.unlock(ctx, lk, nil) // nil when declined
	if taken > 0 {
		ws.failLeader(ws[0].err) // the leader has no time left to write
	} else {
		l.cacheDenials(ws)
	}
	return nil
}

// take decides w on r's levels and, if admitted, takes its units. A call
// with no time left for the write is answered errLate, takes nothing, and
// is gone: not decided again (a leader's batch ends on it).
func (l *leader) take(w *waiter, r reading) bool {
	rules := l.c.set.rules
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
	w.until = math.MaxInt64
	if !w.deadline.IsZero() {
		w.until = max(r.clock.until(l.lim.clock.local(w.deadline, false)), 1)
		if w.until <= r.now {
			w.res, w.err = Result{}, errLate
			w.gone.Store(true)
			return false
		}
	}
	for j := range r.levels {
		r.levels[j] = d.level(j)
	}
	w.res = d.result(rules)
	return true
}

// commit writes r's levels and releases the lock; it returns the calls to
// decide again when the lease lapsed or the write came late: nothing was
// written.
func (l *leader) commit(ctx context.Context, ws sealed, lk *mutex.Lock, r reading) sealed {
	args := writeArgs(l.c.set.rules, r.levels, r.now, ws.deadline())
	if lk == nil {
		return l.commitFree(ctx, ws, args)
	}
	if ctxcall.Ended(ctx) != nil { // no time left: release without writing
		_, _ = l.lim.unlock(ctx, lk, nil)
		return ws.late()
	}
	reply, err := l.lim.unlock(ctx, lk, &mutex.Call{Fragment: writeBack, Keys: []string{l.c.key}, Args: args})
	late, _ := reply.(int64) // write.lua's minus the server time: late
	switch {
	case errors.Is(err, mutex.ErrNotHeld):
		return ws
	case err != nil:
		ws.failAdmitted(err)
	case late < 0:
		return l.wroteLate(ws, -late)
	default:
		l.wrote(ws, args, "")
	}
	return nil
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

// wroteLate handles a write refused as late at server time now: nothing
// was written, and the clock sample it was bounded by was wrong.
func (l *leader) wroteLate(ws sealed, now int64) sealed {
	l.lim.clock.keep(l.lim.clock.sampled(now, time.Now()))
	l.late = true
	return ws.late()
}

func (l *leader) cacheDenials(ws sealed) {
	for _, w := range ws {
		if w.err == nil && l.lim.denials != nil {
			l.lim.denials.store(l.c.name, l.c.set, w.n, l.sent, l.epoch, w.res)
		}
	}
}

// wrote keeps the denials of ws in the deny cache and the values of their
// commit, write.lua's args (field, value pairs after two numbers), in the
// state cache, as Redis holds them: with commit.lua's nonce, if any.
func (l *leader) wrote(ws sealed, args []any, nonce string) {
	l.cacheDenials(ws)
	if !l.cache {
		return
	}
	values := make([]string, len(l.c.set.rules))
	for i := range values {
		if values[i], _ = args[3+2*i].(string); values[i] != "" && nonce != "" {
			values[i] += ":" + nonce
		}
	}
	others := len(ws) > 1
	l.lim.states.store(l.c.key, l.c.set, values, &others)
}

// releaseTimeout bounds a release that finishes after its call returned.
const releaseTimeout = 2 * time.Second

// unlock releases lk, running call (nil: none) as it does, while ctx has
// time; if that fails without saying the lock is gone, or ctx has no time
// left, a goroutine of its own releases it, bounded by releaseTimeout.
func (lim *Limiter) unlock(ctx context.Context, lk *mutex.Lock, call *mutex.Call) (any, error) {
	if err := ctxcall.Ended(ctx); err != nil {
		go lim.finishRelease(ctx, lk, nil)
		return nil, err
	}
	reply, err := releaseWith(ctx, lk, call)
	if err != nil && !errors.Is(err, mutex.ErrNotHeld) {
		go lim.finishRelease(ctx, lk, call) // the same call: a retry answers as the first
	}
	return reply, err
}

// finishRelease releases lk after its caller left. It sends nothing until
// the server answers a PING (go-redis counts failed dials toward its dial
// breaker).
func (lim *Limiter) finishRelease(ctx context.Context, lk *mutex.Lock, call *mutex.Call) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if lim.dial != nil && outage.Answering(ctx, lim.dial) != nil {
		return // the lease ends the lock
	}
	_, _ = releaseWith(ctx, lk, call)
}

func releaseWith(ctx context.Context, lk *mutex.Lock, call *mutex.Call) (any, error) {
	if call == nil {
		return nil, lk.Unlock(ctx)
	}
	return lk.UnlockWith(ctx, *call)
}
