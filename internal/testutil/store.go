package testutil

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A Store is a Redis whose every key belongs to one test: a fresh miniredis,
// or a real server of the test's own. Bad-input tests use it to check, after
// each case, that nothing was written outside the test's prefix or without a
// TTL, and how many commands a call sent.
type Store struct {
	Name   string
	Client *redis.Client
	Prefix string
	Cmds   *CommandCounter // every command Client sent
}

// Stores returns a miniredis Store and, when the server binary is installed (see
// NeedServer), a real-server one; both end with t.
func Stores(t *testing.T) []Store {
	t.Helper()
	mini := Mini(t)
	srv := StartServer(t)
	mc, sc := &CommandCounter{}, &CommandCounter{}
	m, s := mini.Client(t), srv.Client(t)
	m.AddHook(mc)
	s.AddHook(sc)
	return []Store{
		{Name: "miniredis", Client: m, Prefix: mini.Prefix, Cmds: mc},
		{Name: "redis", Client: s, Prefix: NewPrefix(), Cmds: sc},
	}
}

// CheckKeys fails t for every key of s outside s.Prefix or without a TTL;
// after names the case that just ran.
func (s Store) CheckKeys(t *testing.T, after string) {
	t.Helper()
	ctx := context.Background()
	iter := s.Client.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if !strings.HasPrefix(k, s.Prefix) {
			t.Errorf("%s, after %s: key %.80q is outside the prefix %q", s.Name, after, k, s.Prefix)
		}
		// PTTL: -1 (ns, as go-redis returns it) for a key without a TTL, -2
		// for one gone since SCAN, 0 for one in its last millisecond.
		if ttl, err := s.Client.PTTL(ctx, k).Result(); err != nil || ttl == -1 {
			t.Errorf("%s, after %s: key %.80q has no TTL (%v, %v)", s.Name, after, k, ttl, err)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("%s: SCAN: %v", s.Name, err)
	}
}

// CommandCounter is a go-redis hook that counts the commands a client sends.
type CommandCounter struct{ N atomic.Int64 }

// DialHook passes dials through.
func (c *CommandCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

// ProcessHook counts one command.
func (c *CommandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.N.Add(1); return next(ctx, cmd) }
}

// ProcessPipelineHook counts every command of a pipeline.
func (c *CommandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.N.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// NilClients returns a nil client of every kind a caller could pass by
// mistake, by name: untyped nil, and typed nils that a plain == nil check
// would miss.
func NilClients() map[string]redis.Scripter {
	var (
		client  *redis.Client
		cluster *redis.ClusterClient
		ring    *redis.Ring
		univ    redis.UniversalClient
	)
	return map[string]redis.Scripter{
		"untyped nil": nil, "nil *redis.Client": client, "nil *redis.ClusterClient": cluster,
		"nil *redis.Ring": ring, "nil redis.UniversalClient": univ,
	}
}

// WithoutRecords returns keys less the short-lived records of lock releases
// (<prefix>{name}:record and <prefix>{name}:record:<token>, kept seconds so
// that a retried release reports what the first did), for tests that count
// what a call left.
func WithoutRecords(keys []string) []string {
	out := keys[:0:0]
	for _, k := range keys {
		if !IsRecord(k) {
			out = append(out, k)
		}
	}
	return out
}

// IsRecord reports whether key is a lock release's record (see
// WithoutRecords).
func IsRecord(key string) bool {
	return strings.HasSuffix(key, "}:record") || strings.Contains(key, "}:record:")
}

// CountKeys returns how many keys c's database holds, release records left
// out (see WithoutRecords).
func CountKeys(ctx context.Context, c *redis.Client) int64 {
	return int64(len(WithoutRecords(c.Keys(ctx, "*").Val())))
}
