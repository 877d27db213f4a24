package mutex

import (
	"fmt"
	"slices"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/nilcheck"
	"github.com/redis/go-redis/v9"
)

// NewQuorum returns a Locker that keeps each lock on a majority of N
// independent Redis masters (the Redlock algorithm), so that a lock survives
// the loss of a minority of them. It has the API of New's Locker: TryLock,
// Lock, Unlock, Extend, TTL, WithAutoRenew, Done, Context and re-entry.
//
// Each call runs on every node in parallel, each node bounded by a node
// timeout (WithNodeTimeout) far below the lease. An acquisition succeeds when
// N/2+1 nodes grant it and the time it took, on the client's monotonic clock,
// leaves the lease valid: elapsed < lease - drift, with drift 1% of the lease
// plus 2 ms. Otherwise the attempt is released on every node, and the call
// returns ErrLocked (a majority is held by others or rejoining: Lock keeps
// waiting) or an error matching ErrNoQuorum joined with each failed node's
// error (too many nodes failed: Lock gives up at once). Extend, renewal and
// TTL need a majority too; when a majority no longer has the lock, it is lost.
//
// Fencing and Fragments need the lock and the data in one Redis: NewQuorum
// refuses WithFencing with ErrInvalid, and TryLockWith, LockWith, Run and
// UnlockWith return ErrUnsupported. It refuses WithReplicaAck too (each
// node is its own master). Waiters hear of releases by polling and from
// local Unlocks (no Pub/Sub, no hand-over in the release script).
//
// A node restarted without persistence has forgotten the locks it granted; if
// it rejoins at once, another client can win a majority that includes it
// while the first holder still believes it holds the lock. Run the masters
// with appendonly yes and appendfsync always, or keep a restarted node out
// for longer than the longest lease: WithRejoinDelay does that.
//
// The nodes must be distinct masters: not replicas of each other and not
// members of one cluster. Their clients must honour context deadlines
// (redis.Options.ContextTimeoutEnabled), or the node timeout could not cut a
// hung node short. NewQuorum returns an error matching ErrInvalid for fewer
// than MinQuorumNodes clients, a nil client, a client listed twice or one
// that ignores context deadlines, and for a bad option.
func NewQuorum(clients []Client, opts ...Option) (*Locker, error) {
	if err := checkNodes(clients); err != nil {
		return nil, err
	}
	q := &quorum{nodes: slices.Clone(clients), need: len(clients)/2 + 1}
	// notify stays false: a quorum's releases announce nothing.
	l := &Locker{client: clients[0], dep: q, prefix: DefaultPrefix, ttl: DefaultTTL, retry: DefaultRetryInterval, honours: true, runner: ctxcall.NewRunner(clients[0]), releases: newReleases()}
	if err := l.configure(q, inQuorum, opts); err != nil {
		return nil, err
	}
	l.box()
	if q.timeout == 0 {
		q.timeout = min(DefaultNodeTimeout, l.ttl/10)
	}
	if q.rejoin > 0 {
		q.up = &Call{Fragment: rejoinGate, Keys: []string{l.prefix + "quorum:up"}, Args: []any{q.rejoin.Milliseconds(), DefaultFenceTTL.Milliseconds()}}
	}
	return l, nil
}

// checkNodes refuses a quorum's clients unless there are enough of them,
// all distinct, none nil, each bounding its commands by their context.
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

// checkNode refuses client i of a quorum.
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
