package servercheck

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/nilcheck"
	"github.com/redis/go-redis/v9"
)

// NoEviction is the one maxmemory-policy that never deletes funnelguard's
// keys whatever maxmemory is.
const NoEviction = "noeviction"

// Errors reported by this package; match them with errors.Is. A Finding's
// Err wraps one with the server's address and the cause.
var (
	// ErrEvictionPolicy means a memory limit and a maxmemory-policy other
	// than noeviction: once full, the server deletes funnelguard's keys.
	ErrEvictionPolicy = errors.New("servercheck: maxmemory-policy evicts funnelguard keys")
	// ErrUnknownPolicy means the server answered but did not tell its
	// maxmemory-policy (INFO memory and CONFIG GET both refused or silent,
	// as on some managed services or miniredis); the cause is wrapped.
	ErrUnknownPolicy = errors.New("servercheck: maxmemory-policy unknown")
	// ErrNoAnswer means the server could not be asked: a connection error,
	// or no reply by the context's deadline (with ctx.Err()).
	ErrNoAnswer = errors.New("servercheck: no answer from the server")
	// ErrNilClient means Check was given a nil client, typed or not.
	ErrNilClient = errors.New("servercheck: nil client")
)

// A Finding is what Check learnt about one server.
type Finding struct {
	// Addr is the server's address as the client dials it; a failover
	// client's master's as it reports it (CLIENT INFO laddr), or
	// "FailoverClient".
	Addr string
	// MaxMemory is the memory limit in bytes: 0 for none, -1 unknown.
	MaxMemory int64
	// Policy is the maxmemory-policy, "" when unknown.
	Policy string
	// Note, if not "", says why a safe server would not stay safe: its
	// policy evicts once a memory limit is set.
	Note string
	// Err is nil when the server cannot evict funnelguard's keys, else it
	// wraps ErrEvictionPolicy, ErrUnknownPolicy or ErrNoAnswer and names
	// the server (and the fix).
	Err error
}

// Check asks every server that c writes to whether it may evict
// funnelguard's keys, and returns one Finding per server, ordered by
// address; it changes nothing on them. Its error joins the findings'
// errors (nil when every server is safe), or wraps ErrNoAnswer for a
// cluster whose slots could not be loaded; ErrNilClient for a nil client.
// A server that has not answered by ctx's deadline gets ErrNoAnswer and
// ctx.Err().
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

// joinErrors returns Check's error: the findings' errors, or err, why
// Check stopped asking, when no server could be asked.
func joinErrors(findings []Finding, err error) error {
	if err != nil && len(findings) == 0 {
		return fmt.Errorf("%w: %w", ErrNoAnswer, err)
	}
	errs := make([]error, len(findings))
	for i, f := range findings {
		errs[i] = f.Err
	}
	return errors.Join(errs...)
}

// askAll asks each server of c (as the package doc says) into col; its
// error is that of a cluster's slots that could not be loaded.
func askAll(ctx context.Context, c redis.UniversalClient, col *collector) error {
	switch c := c.(type) {
	case *redis.ClusterClient:
		if err := forEachMaster(ctx, c, col); err != nil {
			return fmt.Errorf("cluster %s: %w", strings.Join(c.Options().Addrs, ","), err)
		}
	case *redis.Ring:
		askRing(ctx, c, col)
	case *redis.Client:
		col.ask(ctx, c, c.Options().Addr) // a failover client's is failoverAddr
	default:
		col.ask(ctx, c, failoverAddr)
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

// forEachMaster asks every master of c into col. ForEachMaster reloads the
// slots first, from a node picked at random, which may hang: the reload
// gets half the time left, and only a client that had no slots tries
// again, with all of it.
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

// failoverAddr is the address go-redis gives a failover client's options,
// and here that of any server whose address only the server knows.
const failoverAddr = "FailoverClient"

// A collector gathers the findings of one Check, which closes it when it
// returns, before asking ended on a client that ignores deadlines: the
// askers' late findings are dropped (close returns a copy).
type collector struct {
	mu       sync.Mutex
	findings []Finding
	closed   bool
}

// ask asks the server of c at addr (failoverAddr: the server knows it)
// for its settings, and judges them into col.
func (col *collector) ask(ctx context.Context, c redis.Cmdable, addr string) {
	a := asking{ctx: ctx, c: c, f: Finding{Addr: addr, MaxMemory: -1}}
	if i := col.start(a.f); i >= 0 {
		a.judge(a.settings())
		col.finish(i, a.f)
	}
}

// start records f, a server being asked with nothing known yet, and
// returns its index, or -1 when the collector is closed.
func (col *collector) start(f Finding) int {
	col.mu.Lock()
	defer col.mu.Unlock()
	if col.closed {
		return -1
	}
	col.findings = append(col.findings, f)
	return len(col.findings) - 1
}

// finish records the finding of index i.
func (col *collector) finish(i int, f Finding) {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.findings[i] = f
}

// missing records err as the finding of a server at addr that was not asked
// at all, unless a finding names addr already.
func (col *collector) missing(addr string, err error) {
	col.mu.Lock()
	defer col.mu.Unlock()
	if slices.ContainsFunc(col.findings, func(f Finding) bool { return f.Addr == addr }) {
		return
	}
	col.findings = append(col.findings, Finding{Addr: addr, MaxMemory: -1, Err: err})
}

// close closes the collector and returns its findings ordered by address; a
// server still being asked (no Err and no Policy: ask judges every
// server to one or the other) gets ErrNoAnswer with cause, why Check
// stopped waiting (never nil then: askAll returns once every ask did).
func (col *collector) close(cause error) []Finding {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.closed = true
	out := slices.Clone(col.findings)
	for i := range out {
		if out[i].Err == nil && out[i].Policy == "" {
			out[i].Err = fmt.Errorf("%w: %s: %w", ErrNoAnswer, out[i].Addr, cause)
		}
	}
	slices.SortStableFunc(out, func(a, b Finding) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}
