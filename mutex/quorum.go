package mutex

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
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

func (q *quorum) nodeCount() int { return len(q.nodes) }

// unsupported refuses what needs the lock and its data in one Redis.
func (*quorum) unsupported(what string) error {
	return fmt.Errorf("%w: %s on a quorum (the data must live in the lock's Redis)", ErrUnsupported, what)
}

// spend keeps nothing on a quorum (the spent memory serves one Redis, where
// spent.lua runs): clearSpent finds no token, and an attempt deletes no
// lock.
func (*quorum) spend(*hold) {}

// nodeReply is one node's answer to a script.
type nodeReply struct {
	reply any
	err   error
}

// fan runs script on every node in parallel, each bounded by the node
// timeout, and returns the replies in node order. Errors name their node.
func (q *quorum) fan(ctx context.Context, script *redis.Script, keys []string, args []any) []nodeReply {
	out := make([]nodeReply, len(q.nodes))
	var wg sync.WaitGroup
	for i, c := range q.nodes {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, q.timeout)
			defer cancel()
			out[i].reply, out[i].err = script.Run(nctx, c, keys, args...).Result()
			if out[i].err != nil {
				out[i].err = fmt.Errorf("node %d%s: %w", i, addr(c), out[i].err)
			}
		})
	}
	wg.Wait()
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

// acquire runs the acquire script on every node (call is nil: NewQuorum
// refuses fragments). It returns the reply a single Redis would have given,
// {1, lease ms, 0} or {0, pttl ms, 0}; or ErrNoQuorum joined with the
// failed nodes' errors.
func (q *quorum) acquire(ctx context.Context, l *Locker, _ string, n *names, cfg lockConfig, _ *Call, arg any, start time.Time) ([3]int64, any, error) {
	if arg == argMark {
		arg = argFresh // a quorum's releases neither publish nor yield: a mark serves nothing
	}
	keys, args := scriptCall(nil, n, false, n.token, arg, cfg.ttlMS, l.fenceMS)
	script, sendKeys, sendArgs := acquireScript, keys, args
	if q.up != nil {
		// The gate's keys and arguments first (fragment.go).
		sendKeys = append(append(make([]string, 0, len(q.up.Keys)+len(keys)), q.up.Keys...), keys...)
		sendArgs = append(append(make([]any, 0, len(q.up.Args)+len(args)), q.up.Args...), args...)
		script = q.up.Fragment.acquire
	}
	v := q.poll(ctx, script, sendKeys, sendArgs, readAcquire)
	elapsed, lease := time.Since(start), cfg.ttl
	if len(v.yes) >= q.need && elapsed < lease-drift(lease) {
		// The lease a majority still has: the need-th longest.
		return [3]int64{1, v.nth(q.need), 0}, nil, nil
	}
	// No majority in time: undo this attempt everywhere (nodes that erred
	// may have granted it too).
	q.undo(ctx, n, arg)
	if err := v.refusal(len(q.nodes), q.need, elapsed, lease); err != nil {
		return [3]int64{}, nil, err
	}
	if reentering(arg) {
		return [3]int64{0, -2, 0}, nil, nil
	}
	return [3]int64{0, v.wait, 0}, nil, nil
}

// undo releases one handle (id) of n's token on every node, for an attempt
// that did not win a majority.
func (q *quorum) undo(ctx context.Context, n *names, id any) {
	ctx = context.WithoutCancel(ctx)
	o, s, m := noStamp.releaseArgs()
	q.fan(ctx, releaseScript, []string{n.key, n.nkey, n.tkey}, []any{n.token, id, "", 0, 0, o, s, m})
}

// release closes the handle of r on every node: the hold ends when no node
// reports a handle left open.
func (q *quorum) release(ctx context.Context, r *release) (any, error) {
	h := r.h
	o, s, m := noStamp.releaseArgs()
	v := q.poll(ctx, releaseScript, []string{h.key, h.nkey, h.tkey}, []any{h.token, handleID(r.lk.id), "", 0, 0, o, s, m}, readHolder(-1))
	err := v.verdict(len(q.nodes), q.need, "unlock", "hold the lock")
	switch {
	case errors.Is(err, ErrNotHeld):
		h.end(lost)
		return nil, ErrNotHeld
	case err != nil:
		return nil, fmt.Errorf("mutex: unlock %q: %w", h.name, err)
	}
	left := slices.Max(v.yes) // the handles left open: the most any node reports
	h.release(r.lk, left == 0)
	if left == 0 {
		r.l.released(h.name)
	}
	return nil, nil
}

// extend sets the lease on every node; it succeeds when a majority has it
// and the call left the lease valid, and reports false when a majority
// cannot (the lock is lost).
func (q *quorum) extend(ctx context.Context, h *hold, id string, lease time.Duration, start time.Time) (bool, error) {
	v := q.poll(ctx, extendScript, []string{h.key}, []any{h.token, id, lease.Milliseconds()}, readHolder(0))
	switch err := v.verdict(len(q.nodes), q.need, "extend", "hold the lock"); {
	case errors.Is(err, ErrNotHeld):
		return false, nil
	case err != nil:
		return false, err
	}
	if elapsed := time.Since(start); elapsed >= lease-drift(lease) {
		return false, noQuorum(fmt.Sprintf("extending took %v of a %v lease", elapsed, lease), nil)
	}
	return true, nil
}

// pttl returns the lease a majority of nodes still has.
func (q *quorum) pttl(ctx context.Context, lk *Lock) (time.Duration, error) {
	h := lk.hold
	v := q.poll(ctx, pttlScript, []string{h.key}, []any{h.token, handleID(lk.id)}, readHolder(-3))
	if err := v.verdict(len(q.nodes), q.need, "ttl", "hold the lock"); err != nil {
		return 0, err
	}
	return time.Duration(v.nth(q.need)) * time.Millisecond, nil
}

// semaphores keeps a semaphore on SemaphoreQuorum's nodes, unless the
// quorum has a rejoin gate, which the semaphore's scripts do not run.
func (q *quorum) semaphores(size int64) (semDeployment, error) {
	if q.up != nil {
		return nil, fmt.Errorf("%w: a semaphore on a quorum WithRejoinDelay (its scripts do not run the rejoin gate)", ErrUnsupported)
	}
	need, err := SemaphoreQuorum(len(q.nodes), size)
	return semQuorum{q: q, need: need}, err
}
