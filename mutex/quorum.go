package mutex

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// Defaults and limits of a quorum Locker.
const (
	// MinQuorumNodes is the fewest independent masters NewQuorum accepts.
	MinQuorumNodes = 3
	// DefaultNodeTimeout bounds each node's part of a quorum call, unless
	// the Locker's TTL is under 500 ms: then it is TTL/10.
	DefaultNodeTimeout = 50 * time.Millisecond
)

// A quorum is the set of independent masters a Redlock-style Locker keeps
// every lock on.
type quorum struct {
	nodes   []Client
	need    int           // len(nodes)/2 + 1
	timeout time.Duration // per node and call
	rejoin  time.Duration // 0: a restarted node votes at once
	up      *Call         // the rejoin gate, when rejoin > 0
}

//go:embed rejoin.lua
var rejoinSrc string

// rejoinGate runs with every acquire attempt of a Locker made with
// WithRejoinDelay: it declines on a node that started (or lost its data) less
// than the delay ago.
var rejoinGate = NewGate(rejoinSrc)

// unsupported rejects the calls a quorum Locker cannot make.
func (l *Locker) unsupported(what string) error {
	if l != nil && l.q != nil {
		return fmt.Errorf("%w: %s on a quorum (the data must live in the lock's Redis)", ErrUnsupported, what)
	}
	return nil
}

// nodeReply is one node's answer to a script.
type nodeReply struct {
	reply any
	err   error
}

// fan runs script on every node in parallel, each bounded by the node
// timeout, and returns the replies in node order. Errors name their node.
func (q *quorum) fan(ctx context.Context, script *redis.Script, keys []string, args []any) []nodeReply {
	out := make([]nodeReply, len(q.nodes))
	var g errgroup.Group
	for i, c := range q.nodes {
		g.Go(func() error {
			nctx, cancel := context.WithTimeout(ctx, q.timeout)
			defer cancel()
			out[i].reply, out[i].err = script.Run(nctx, c, keys, args...).Result()
			if out[i].err != nil {
				out[i].err = fmt.Errorf("node %d%s: %w", i, addr(c), out[i].err)
			}
			return nil
		})
	}
	_ = g.Wait() // the goroutines never fail: each reply carries its error
	return out
}

// addr names a node by address when its client tells it.
func addr(c Client) string {
	if o, ok := c.(interface{ Options() *redis.Options }); ok {
		return " (" + o.Options().Addr + ")"
	}
	return ""
}

// noQuorum is the error of a call that too many nodes failed.
func noQuorum(what string, errs []error) error {
	return errors.Join(append([]error{fmt.Errorf("%w: %s", ErrNoQuorum, what)}, errs...)...)
}

// acquire runs the acquire script on every node. It returns the reply a
// single Redis would have given, {1, lease ms, 0} or {0, pttl ms, 0}; or
// ErrNoQuorum joined with the failed nodes' errors.
func (q *quorum) acquire(ctx context.Context, keys []string, args []any, lease time.Duration, reenter bool, start time.Time, n *names) ([3]int64, error) {
	script, sendKeys, sendArgs := acquireScript, keys, args
	if q.up != nil {
		// The gate's keys and arguments first (fragment.go).
		sendKeys = append(append(make([]string, 0, len(q.up.Keys)+len(keys)), q.up.Keys...), keys...)
		sendArgs = append(append(make([]any, 0, len(q.up.Args)+len(args)), q.up.Args...), args...)
		script = q.up.Fragment.acquire
	}
	v := votes{wait: -1}
	for _, nr := range q.fan(ctx, script, sendKeys, sendArgs) {
		v.count(nr)
	}
	elapsed := time.Since(start)
	if len(v.leases) >= q.need && elapsed < lease-drift(lease) {
		slices.Sort(v.leases)
		// The lease a majority still has: the need-th longest.
		return [3]int64{1, v.leases[len(v.leases)-q.need], 0}, nil
	}
	// No majority in time: undo this attempt everywhere (nodes that erred
	// may have granted it too).
	q.undo(ctx, n, args[1])
	switch {
	case len(v.errs) > len(q.nodes)-q.need:
		return [3]int64{}, noQuorum(fmt.Sprintf("%d of %d nodes failed", len(v.errs), len(q.nodes)), v.errs)
	case len(v.leases) >= q.need:
		return [3]int64{}, noQuorum(fmt.Sprintf("acquiring took %v of a %v lease", elapsed, lease), v.errs)
	case reenter:
		return [3]int64{0, -2, 0}, nil
	}
	return [3]int64{0, v.wait, 0}, nil
}

// undo releases one handle (id) of n's token on every node, for an attempt
// that did not win a majority.
func (q *quorum) undo(ctx context.Context, n *names, id any) {
	ctx = context.WithoutCancel(ctx)
	o, s, m := noStamp.releaseArgs()
	q.fan(ctx, releaseScript, []string{n.key, n.nkey, n.tkey}, []any{n.token, id, "", 0, 0, o, s, m})
}

// tally runs a holder's script on every node: held are the values of the
// nodes where the handle holds the lock (value >= 0), lost counts the nodes
// where it does not (value == notHeld).
func (q *quorum) tally(ctx context.Context, script *redis.Script, keys []string, args []any, notHeld int64) (held []int64, lost int, errs []error) {
	for _, nr := range q.fan(ctx, script, keys, args) {
		err := nr.err
		var v int64
		if err == nil {
			if arr, ok := nr.reply.([]any); ok {
				var r [3]int64
				if r, _, err = ints(arr, 1); err == nil {
					v = r[0]
				}
			} else {
				v, err = integer(nr.reply)
			}
		}
		switch {
		case err != nil:
			errs = append(errs, err)
		case v == notHeld:
			lost++
		default:
			held = append(held, v)
		}
	}
	return held, lost, errs
}

// verdict reads a tally: ok when a majority holds the handle, ErrNotHeld
// when a majority cannot (the lock is lost), otherwise ErrNoQuorum.
func (q *quorum) verdict(what string, held []int64, lost int, errs []error) error {
	switch {
	case len(held) >= q.need:
		return nil
	case lost > len(q.nodes)-q.need:
		return ErrNotHeld
	}
	return noQuorum(fmt.Sprintf("%s: %d of %d nodes hold the lock, %d failed", what, len(held), len(q.nodes), len(errs)), errs)
}

// release closes one handle on every node and returns how many handles are
// left open (the most any node reports).
func (q *quorum) release(ctx context.Context, h *hold, id string) (int64, error) {
	o, s, m := noStamp.releaseArgs()
	held, lost, errs := q.tally(ctx, releaseScript, []string{h.key, h.nkey, h.tkey}, []any{h.token, id, "", 0, 0, o, s, m}, -1)
	if err := q.verdict("unlock", held, lost, errs); err != nil {
		return -1, err
	}
	return slices.Max(held), nil
}

// extend sets the lease on every node; it succeeds when a majority has it
// and the call left the lease valid.
func (q *quorum) extend(ctx context.Context, h *hold, id string, lease time.Duration, start time.Time) error {
	held, lost, errs := q.tally(ctx, extendScript, []string{h.key}, []any{h.token, id, lease.Milliseconds()}, 0)
	if err := q.verdict("extend", held, lost, errs); err != nil {
		return err
	}
	if elapsed := time.Since(start); elapsed >= lease-drift(lease) {
		return noQuorum(fmt.Sprintf("extending took %v of a %v lease", elapsed, lease), nil)
	}
	return nil
}

// pttl returns the lease a majority of nodes still has.
func (q *quorum) pttl(ctx context.Context, h *hold, id string) (time.Duration, error) {
	held, lost, errs := q.tally(ctx, pttlScript, []string{h.key}, []any{h.token, id}, -3)
	if err := q.verdict("ttl", held, lost, errs); err != nil {
		return 0, err
	}
	slices.Sort(held)
	return time.Duration(held[len(held)-q.need]) * time.Millisecond, nil
}

// extend sets the lease of handle id ("" for any handle: renewal) on the
// hold's Redis, or on a majority of a quorum's nodes. It reports false when
// the lock is no longer held.
func (h *hold) extend(ctx context.Context, id string, lease time.Duration, start time.Time) (bool, error) {
	if q := h.locker.q; q != nil {
		err := q.extend(ctx, h, id, lease, start)
		if errors.Is(err, ErrNotHeld) {
			return false, nil
		}
		return err == nil, err
	}
	reply, short, err := h.locker.runAcked(ctx, extendScript, []string{h.key}, []any{h.token, id, lease.Milliseconds()}, nil)
	if err != nil {
		return false, err
	}
	n, err := integer(reply)
	if err == nil && n == 1 && short != nil {
		return true, short // extended on the master alone
	}
	return n == 1, err
}

// unlockQuorum releases a quorum lock's handle on every node.
func (lk *Lock) unlockQuorum(ctx context.Context) error {
	h, l := lk.hold, lk.hold.locker
	left, err := l.q.release(ctx, h, handleID(lk.id))
	if errors.Is(err, ErrNotHeld) {
		h.end(lost)
		return ErrNotHeld
	}
	if err != nil {
		return fmt.Errorf("mutex: unlock %q: %w", h.name, err)
	}
	h.release(lk, left == 0)
	if left == 0 {
		l.released(h.name)
	}
	return nil
}
