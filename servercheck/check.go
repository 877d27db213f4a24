package servercheck

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/nilcheck"
	"github.com/redis/go-redis/v9"
)

// NoEviction is the one maxmemory-policy that never deletes funnelguard's
// keys whatever maxmemory is.
const NoEviction = "noeviction"

// A Finding is what Check learnt about one server. The zero value is not a
// meaningful finding.
type Finding struct {
	// Addr is the server's address as the client dials it (host:port). A
	// failover client's is its current master's, as the server reports it
	// (CLIENT INFO laddr), or "FailoverClient" when it does not say.
	Addr string
	// MaxMemory is the server's memory limit in bytes: 0 for none, -1 when
	// unknown.
	MaxMemory int64
	// Policy is the server's maxmemory-policy (noeviction, allkeys-lru,
	// volatile-ttl...), "" when unknown.
	Policy string
	// Note, when not "", says why a server found safe would not stay safe:
	// its policy evicts, but it has no memory limit yet.
	Note string
	// Err is nil when the server cannot evict funnelguard's keys. Otherwise
	// it wraps ErrEvictionPolicy, ErrUnknownPolicy or ErrNoAnswer, and its
	// message names the server (and, for a policy that evicts, the fix).
	Err error
}

// Check asks every server that c writes to whether it may evict
// funnelguard's keys (see the package documentation), and returns one
// Finding per server, ordered by address.
//
// The error is nil when every server is safe. Otherwise it joins the
// findings' errors, so errors.Is(err, ErrEvictionPolicy) reports whether any
// server evicts; for a cluster whose slots could not be loaded it wraps
// ErrNoAnswer and the cause, with no findings. A nil client gets
// ErrNilClient. Check changes nothing on the servers.
//
// Check returns by ctx's deadline. A server that has not answered by then
// gets a Finding whose Err wraps ErrNoAnswer and ctx.Err().
func Check(ctx context.Context, c redis.UniversalClient) ([]Finding, error) {
	if nilcheck.IsNil(c) {
		return nil, ErrNilClient
	}
	col := &collector{}
	_, err := ctxcall.Do(ctx, ctxcall.NewRunner(c).Workers(ctx), func(ctx context.Context) (struct{}, error) {
		return struct{}{}, askAll(ctx, c, col)
	}, nil)
	findings := col.close(err)
	return findings, joinErrors(findings, err)
}

// joinErrors returns Check's error: the findings' errors, and err, why
// Check stopped asking, when no server could be asked.
func joinErrors(findings []Finding, err error) error {
	errs := make([]error, 0, len(findings)+1)
	if err != nil && len(findings) == 0 {
		errs = append(errs, fmt.Errorf("%w: %w", ErrNoAnswer, err))
	}
	for _, f := range findings {
		errs = append(errs, f.Err)
	}
	return errors.Join(errs...)
}

// askAll asks each server of c into col. Its error is one that kept it from
// asking any server: a cluster's slots that could not be loaded.
func askAll(ctx context.Context, c redis.UniversalClient, col *collector) error {
	switch c := c.(type) {
	case *redis.ClusterClient:
		return askCluster(ctx, c, col)
	case *redis.Ring:
		askRing(ctx, c, col)
	case *redis.Client:
		col.ask(ctx, c, clientAddr(c))
	default:
		col.ask(ctx, c, "")
	}
	return nil
}

// askCluster asks every master of c into col. Its error is that of slots
// that could not be loaded, naming the cluster by its seed addresses.
func askCluster(ctx context.Context, c *redis.ClusterClient, col *collector) error {
	if err := forEachMaster(ctx, c, col); err != nil {
		return fmt.Errorf("cluster %s: %w", strings.Join(c.Options().Addrs, ","), err)
	}
	return nil
}

// askRing asks every shard of c into col.
func askRing(ctx context.Context, c *redis.Ring, col *collector) {
	_ = c.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
		col.ask(ctx, shard, shard.Options().Addr)
		return nil
	})
	// ForEachShard skips the shards the ring takes to be down: they are
	// servers not checked, so they get a finding too.
	for name, addr := range c.Options().Addrs {
		col.missing(addr, fmt.Errorf("%w: %s: the ring takes shard %q to be down", ErrNoAnswer, addr, name))
	}
}

// clientAddr returns the address of c's server, or "" for a failover
// client: only its server knows which one it is.
func clientAddr(c *redis.Client) string {
	if addr := c.Options().Addr; addr != failoverAddr {
		return addr
	}
	return ""
}

// forEachMaster asks every master of c into col.
//
// ForEachMaster first reloads the slots, from a node picked at random: a
// hung one would hold the reload, and so every ask, until ctx's deadline.
// So the reload gets half the time left; when it fails, ForEachMaster goes
// on with the slots the client had, and only a client that had none tries
// again, with all the time left. (On a client that ignores deadlines, a
// hung node holds the reload for its ReadTimeout all the same.)
func forEachMaster(ctx context.Context, c *redis.ClusterClient, col *collector) error {
	each := func(_ context.Context, node *redis.Client) error {
		col.ask(ctx, node, node.Options().Addr)
		return nil
	}
	d, ok := ctx.Deadline()
	if !ok {
		return c.ForEachMaster(ctx, each)
	}
	rctx, cancel := context.WithDeadline(ctx, time.Now().Add(time.Until(d)/2))
	defer cancel()
	err := c.ForEachMaster(rctx, each)
	if err != nil && ctx.Err() == nil {
		err = c.ForEachMaster(ctx, each)
	}
	return err
}

// failoverAddr is the address go-redis gives a failover client's options.
const failoverAddr = "FailoverClient"

// ask asks the server of c at addr ("": the server knows it) into col.
func (col *collector) ask(ctx context.Context, c redis.Cmdable, addr string) {
	i := col.start(cmp.Or(addr, failoverAddr))
	if i < 0 {
		return
	}
	col.finish(i, askServer(ctx, c, addr))
}
