package funnel

import (
	"context"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/funnelguard/funnelguard/mutex"
)

// A crowded key (statecache.go: its admissions in this process have others
// waiting) is admitted without its lock when nobody else holds it: the
// leader of a batch reads the state (read.lua), decides its calls at the
// read's server time, and writes with commit.lua, which writes only if the
// state is what was read and the lock is free, or else returns the state
// as it is now, on which the batch is decided again at once (no round trip
// to read it), or tells that the lock is held (the batch then takes it).
// That is the lock's guarantee, nobody wrote in between, at one round trip
// per batch and per retry instead of a lock hold and its hand-over: several
// processes admitting on one key (a global budget) never wait for one
// another's lease, hand-over or Pub/Sub, and a batch that lost the race is
// decided again on the state that won it.

// maxLost is how many times a batch's commit may find the state changed
// before the batch takes the lock: commits without it are first come,
// first served, the lock's waiters are served in turn.
const maxLost = 16

// readFree reads the state for a batch of a crowded key: the reply of the
// last commit.lua that found it changed, or read.lua's. It returns the read
// as a gate's (ErrDeclined when a rule has no room for one unit), with no
// lock.
func (l *leader) readFree(ctx context.Context) (*mutex.Lock, any, error) {
	reply := l.next
	l.next = nil
	if reply == nil {
		var err error
		reply, err = l.lim.runner.Run(ctx, readPeek, []string{l.c.key}, l.c.ids, nil)
		if err != nil {
			return nil, nil, corrupt(fmt.Errorf("funnel: read: %w", reach.Mark(err)))
		}
	}
	arr, ok := reply.([]any)
	if !ok || len(arr) < 2 {
		return nil, nil, fmt.Errorf("%w: read returned %T", ErrCorruptState, reply)
	}
	if p, _ := arr[0].(int64); p == 0 {
		return nil, arr[1:], mutex.ErrDeclined
	}
	return nil, arr[1:], nil
}

// commitFree writes the batch's decisions, write.lua's args, with
// commit.lua. It reports whether the batch is to be decided again: on the
// state commit.lua found changed (kept for readFree), or through the lock
// when another holds it.
func (l *leader) commitFree(ctx context.Context, ws sealed, args []any) (again bool) {
	k := len(l.c.rules)
	cas := make([]any, 0, 3*k+3)
	cas = append(cas, l.c.ids...)
	for _, v := range l.seen {
		cas = append(cas, v)
	}
	cas = append(cas, args[0], args[1])
	for i := range k {
		cas = append(cas, args[3+2*i])
	}
	nonce := newNonce()
	cas = append(cas, nonce)
	reply, err := l.lim.runner.Run(ctx, commitScript, []string{l.c.key, l.lockKey}, cas, nil)
	if err != nil {
		// The write may or may not have happened: the admitted calls cannot
		// know; a denial stands (it took nothing).
		ws.failAdmitted(corrupt(fmt.Errorf("funnel: commit: %w", reach.Mark(err))))
		return false
	}
	switch x := reply.(type) {
	case int64:
		if x < 0 { // late: nothing written
			l.lim.clock.keep(l.lim.clock.sampled(-x, time.Now()))
			l.late = true
			return ws.late()
		}
		for i := range k { // what Redis holds: the values with the nonce
			if v, _ := args[3+2*i].(string); v != "" {
				args[3+2*i] = v + ":" + nonce
			}
		}
		l.wrote(ws, args)
		l.cacheDenials(ws)
		return false
	case []any:
		l.lost++
		if p, _ := x[0].(int64); p < 0 || l.lost >= maxLost {
			// Held, or lost too often: the batch takes the lock (admit.lua's
			// gate), and waits its turn.
			l.optimistic, l.seen = false, nil
		} else {
			l.next = x
		}
		return true
	}
	ws.failAdmitted(fmt.Errorf("%w: commit returned %T", ErrCorruptState, reply))
	return false
}
