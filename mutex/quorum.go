package mutex

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/nilcheck"

	"github.com/redis/go-redis/v9"
)

// Defaults and limits of a quorum Locker.
const (
	// MinQuorumNodes is the fewest independent masters NewQuorum accepts.
	MinQuorumNodes = 3
	// DefaultNodeTimeout bounds each node's part of a quorum call (TTL/10
	// when that is less).
	DefaultNodeTimeout = 50 * time.Millisecond
)

// A quorum is the set of masters a Redlock-style Locker keeps locks on.
type quorum struct {
	nodes   []Client
	need    int           // len(nodes)/2 + 1
	timeout time.Duration // per node and call
	rejoin  time.Duration // 0: a restarted node votes at once
	up      *Call         // the rejoin gate, when rejoin > 0
}

//go:embed rejoin.lua
var rejoinSrc string

// rejoinGate declines on a node that started empty less than the rejoin
// delay ago (WithRejoinDelay).
var rejoinGate = NewGate(rejoinSrc)

func (q *quorum) nodeCount() int { return len(q.nodes) }

// unsupported refuses what needs the lock and its data in one Redis.
func (*quorum) unsupported(what string) error {
	return fmt.Errorf("%w: %s on a quorum (the data must live in the lock's Redis)", ErrUnsupported, what)
}

// spend keeps nothing on a quorum: spent.lua serves one Redis.
func (*quorum) spend(*hold) {}

func addr(c Client) string {
	if o, ok := c.(interface{ Options() *redis.Options }); ok {
		return " (" + o.Options().Addr + ")"
	}
	return ""
}

func noQuorum(what string, errs []error) error {
	return errors.Join(append([]error{fmt.Errorf("%w: %s", ErrNoQuorum, what)}, errs...)...)
}

// acquire returns the reply one Redis would have given, or ErrNoQuorum.
func (q *quorum) acquire(ctx context.Context, l *Locker, _ string, n *names, cfg lockConfig, _ *Call, arg any, start time.Time) ([3]int64, any, error) {
	if arg == argMark {
		arg = argFresh // a quorum's releases neither publish nor yield: a mark serves nothing
	}
	keys, args := scriptCall(q.up, n, false, n.token, arg, cfg.ttlMS, l.fenceMS)
	v := q.poll(ctx, acquireOf(q.up), keys, args, readAcquire)
	if left, ok := v.leaseLeft(q.need, start); ok {
		return [3]int64{1, left, 0}, nil, nil
	}
	// No majority in time: undo it everywhere (nodes that erred may have granted).
	keys, args = releaseCall(n, arg, 0, noStamp)
	q.poll(context.WithoutCancel(ctx), releaseScript, keys, args, func(*votes, any) error { return nil })
	if err := v.refusal(len(q.nodes), q.need, time.Since(start), cfg.ttl); err != nil {
		return [3]int64{}, nil, err
	}
	if reentering(arg) {
		return [3]int64{0, -2, 0}, nil, nil
	}
	return [3]int64{0, v.wait, 0}, nil, nil
}

// release closes r's handle on every node; the hold ends when no node
// reports a handle left.
func (q *quorum) release(ctx context.Context, r *release) (any, error) {
	h := r.h
	keys, args := releaseCall(&h.names, argID(r.lk.id), 0, noStamp)
	v := q.poll(ctx, releaseScript, keys, args, readHolder(-1))
	held, err := v.verdict(len(q.nodes), q.need, "unlock", "hold the lock")
	switch {
	case err != nil:
		return nil, opErr("unlock", h.name, err)
	case !held:
		h.end(h, lost)
		return nil, ErrNotHeld
	}
	left := slices.Max(v.yes) // the handles left open: the most any node reports
	h.release(r.lk, left == 0)
	if left == 0 {
		r.l.released(h.name)
	}
	return nil, nil
}

// extend sets the lease on every node: true when a majority has it in
// time, false when a majority no longer has the lock.
func (q *quorum) extend(ctx context.Context, h *hold, id any, lease time.Duration, start time.Time) (bool, error) {
	v := q.poll(ctx, extendScript, []string{h.key}, []any{h.token, id, lease.Milliseconds()}, readHolder(0))
	if held, err := v.verdict(len(q.nodes), q.need, "extend", "hold the lock"); !held {
		return false, err
	}
	err := late(start, lease, lease, nil)
	return err == nil, err
}

// late is the ErrNoQuorum, joined with errs, of an extension sent at start that
// took the lease need nodes gave (less the drift margin); asked is the lease it set.
func late(start time.Time, lease, asked time.Duration, errs []error) error {
	if elapsed := time.Since(start); elapsed >= lease-drift(lease) {
		return noQuorum(fmt.Sprintf("extending took %v of a %v lease", elapsed, asked), errs)
	}
	return nil
}

// pttl returns the lease a majority of nodes still has.
func (q *quorum) pttl(ctx context.Context, lk *Lock) (time.Duration, error) {
	h := lk.hold
	v := q.poll(ctx, pttlScript, []string{h.key}, []any{h.token, argID(lk.id)}, readHolder(-3))
	if held, err := v.verdict(len(q.nodes), q.need, "ttl", "hold the lock"); !held {
		return 0, cmp.Or(err, ErrNotHeld)
	}
	return time.Duration(v.nth(q.need)) * time.Millisecond, nil
}

// semaphores refuses a rejoin gate, which the semaphore's scripts do not run.
func (q *quorum) semaphores(size int64) (semDeployment, error) {
	if q.up != nil {
		return nil, fmt.Errorf("%w: a semaphore on a quorum WithRejoinDelay (its scripts do not run the rejoin gate)", ErrUnsupported)
	}
	need, err := SemaphoreQuorum(len(q.nodes), size)
	return semQuorum{q: q, need: need}, err
}

// NewQuorum returns a Locker that keeps each lock on a majority of N
// independent Redis masters (Redlock). An acquisition that no majority grants
// in time returns ErrLocked, or ErrNoQuorum when too many nodes failed;
// Fragments get ErrUnsupported. The clients must be at least MinQuorumNodes
// distinct masters with ContextTimeoutEnabled, else ErrInvalid. Run them with
// appendfsync always, or use WithRejoinDelay (PROTOCOL.md, "Quorum").
func NewQuorum(clients []Client, opts ...Option) (*Locker, error) {
	if err := checkNodes(clients); err != nil {
		return nil, err
	}
	q := &quorum{nodes: slices.Clone(clients), need: len(clients)/2 + 1}
	l, err := newLocker(clients[0], q, opts)
	if err != nil {
		return nil, err
	}
	l.honours, l.runner = true, ctxcall.NewRunner(clients[0])
	if q.timeout == 0 {
		q.timeout = min(DefaultNodeTimeout, l.defaults.ttl/10)
	}
	if q.rejoin > 0 {
		q.up = &Call{Fragment: rejoinGate, Keys: []string{l.prefix + "quorum:up"}, Args: []any{q.rejoin.Milliseconds(), DefaultFenceTTL.Milliseconds()}}
	}
	return l, nil
}

// checkNodes refuses too few, nil, repeated or deadline-ignoring clients.
func checkNodes(clients []Client) error {
	if len(clients) < MinQuorumNodes {
		return fmt.Errorf("%w: quorum of %d clients: want at least %d", ErrInvalid, len(clients), MinQuorumNodes)
	}
	for i, c := range clients {
		if err := checkNode(clients, i, c); err != nil {
			return err
		}
	}
	return nil
}

func checkNode(clients []Client, i int, c Client) error {
	if nilcheck.IsNil(c) {
		return fmt.Errorf("%w: nil client %d", ErrInvalid, i)
	}
	if j := slices.Index(clients, c); j != i {
		return fmt.Errorf("%w: quorum client %d is also client %d", ErrInvalid, i, j)
	}
	if o, ok := c.(interface{ Options() *redis.Options }); ok && !o.Options().ContextTimeoutEnabled {
		return fmt.Errorf("%w: quorum client %d does not set ContextTimeoutEnabled, so a hung node would hold every call for its ReadTimeout instead of the node timeout", ErrInvalid, i)
	}
	return nil
}

// votes are the nodes' answers to one call of a quorum.
type votes struct {
	yes  []int64 // each yes node's value: a lease in ms, the handles left open
	no   int
	errs []error
	wait int64 // the shortest wait a refusing node reported (-1: none)
	bad  error // a node's report that the call cannot succeed
}

// A ballot reads one node's reply into v; its error counts as the node's.
type ballot func(v *votes, reply any) error

// poll runs script on every node in parallel, within the node timeout, and
// reads the replies in node order.
func (q *quorum) poll(ctx context.Context, script *redis.Script, keys []string, args []any, read ballot) votes {
	out := make([]struct {
		reply any
		err   error
	}, len(q.nodes))
	var wg sync.WaitGroup
	for i, c := range q.nodes {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, q.timeout)
			defer cancel()
			out[i].reply, out[i].err = script.Run(nctx, c, keys, args...).Result()
		})
	}
	wg.Wait()
	v := votes{wait: -1}
	for i, nr := range out {
		err := nr.err
		if err != nil {
			err = fmt.Errorf("node %d%s: %w", i, addr(q.nodes[i]), err)
		} else {
			err = read(&v, nr.reply)
		}
		if err != nil {
			v.errs = append(v.errs, err)
		}
	}
	return v
}

func (v *votes) refused(wait int64) {
	v.no++
	if v.wait < 0 || wait < v.wait {
		v.wait = wait
	}
}

// nth returns the need-th largest yes value (the lease need nodes all still
// have), or -1 when fewer said yes.
func (v *votes) nth(need int) int64 {
	if len(v.yes) < need {
		return -1
	}
	slices.Sort(v.yes)
	return v.yes[len(v.yes)-need]
}

// leaseLeft returns the lease (ms) need nodes all still give, counted from
// start, and whether it outlasts the time the call took (less the drift
// margin): a lock's or permits' grant in time.
func (v *votes) leaseLeft(need int, start time.Time) (int64, bool) {
	left := v.nth(need)
	return left, left > 0 && time.Now().Before(leaseEnd(start, time.Duration(left)*time.Millisecond))
}

// refusal is the error of an acquisition that did not win in time:
// ErrNoQuorum when too many nodes failed or it took too long, nil when the
// nodes refused it.
func (v *votes) refusal(nodes, need int, took, lease time.Duration) error {
	switch {
	case len(v.errs) > nodes-need:
		return noQuorum(fmt.Sprintf("%d of %d nodes failed, %d must grant", len(v.errs), nodes, need), v.errs)
	case len(v.yes) >= need:
		return noQuorum(fmt.Sprintf("acquiring took %v of a %v lease", took, lease), v.errs)
	}
	return nil
}

// verdict reads the votes of a holder's call: held when need nodes said yes,
// not when too many said no, else ErrNoQuorum joined with the errors.
func (v *votes) verdict(nodes, need int, what, did string) (held bool, err error) {
	switch {
	case len(v.yes) >= need:
		return true, nil
	case v.no > nodes-need:
		return false, nil
	}
	return false, noQuorum(fmt.Sprintf("%s: %d of %d nodes %s, %d failed, %d must", what, len(v.yes), nodes, did, len(v.errs), need), v.errs)
}

// readAcquire reads a node's acquire reply; a re-entry that found no lock
// ({0, -2}) counts for nothing.
func readAcquire(v *votes, reply any) error {
	r, res, err := acquired(reply)
	switch {
	case err != nil:
		return err
	case r[0] == 1:
		v.yes = append(v.yes, r[1])
	case r[0] == 0 && r[1] >= 0:
		v.refused(r[1]) // held by another: free again after its lease at most
	case r[0] == declinedReply:
		// The rejoin gate's result: the ms until the node grants.
		if w, _, err := ints(res, 1); err == nil {
			v.refused(w[0])
		}
	}
	return nil
}

// readHolder returns the ballot of a holder's script: no when the node's
// value is notHeld, else yes with it.
func readHolder(notHeld int64) ballot {
	return func(v *votes, reply any) error {
		r, _, err := ints(reply, 1) // an integer, or an array led by one
		switch {
		case err != nil:
			return err
		case r[0] == notHeld:
			v.no++
		default:
			v.yes = append(v.yes, r[0])
		}
		return nil
	}
}
