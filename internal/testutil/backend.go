package testutil

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// A Backend is one Redis a test runs on, with a key prefix of the test's own.
type Backend struct {
	// Name is "miniredis" or "redis".
	Name string
	// Mini is the miniredis of the test, nil on a real server. Time in
	// miniredis moves only through Mini.FastForward and Mini.SetTime.
	Mini *miniredis.Miniredis
	// Server is the shared real server, nil on miniredis.
	Server *Server
	// Prefix is unique to the test: every key the test writes should start
	// with it. Keys under it are deleted when the test ends. It holds no
	// glob characters and no braces.
	Prefix string
	addr   string
}

// Real reports whether the backend is a real server (not miniredis).
func (b *Backend) Real() bool { return b.Server != nil }

// Client returns a new client of the backend that t closes when it ends.
func (b *Backend) Client(t testing.TB) *redis.Client {
	return b.ClientOpts(t, &redis.Options{})
}

// ClientOpts is Client with options; Addr is set by the backend.
func (b *Backend) ClientOpts(t testing.TB, o *redis.Options) *redis.Client {
	o.Addr = b.addr
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// Backends runs f as two subtests of t: on miniredis (a fresh one) and on the
// shared real server (skipped without the server binary, see NeedServer).
func Backends(t *testing.T, f func(t *testing.T, b *Backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) { f(t, Mini(t)) })
	t.Run("redis", func(t *testing.T) { f(t, RealBackend(t)) })
}

// ServerTestsOnlyEnv, set to 1, has Mini skip its test (doc.go).
const ServerTestsOnlyEnv = "FUNNELGUARD_SERVER_TESTS_ONLY"

// Mini returns a backend on a fresh miniredis, closed when t ends; it skips
// t when ServerTestsOnlyEnv is 1.
func Mini(t testing.TB) *Backend {
	if os.Getenv(ServerTestsOnlyEnv) == "1" {
		t.Skip("a miniredis test: " + ServerTestsOnlyEnv + "=1 runs only the tests on a real server")
	}
	m := miniredis.RunT(t)
	return &Backend{Name: "miniredis", Mini: m, Prefix: NewPrefix(), addr: m.Addr()}
}

// RealBackend returns a backend on the shared real server; the keys under its
// prefix are deleted when t ends.
func RealBackend(t testing.TB) *Backend {
	t.Helper()
	s := Real(t)
	b := &Backend{Name: "redis", Server: s, Prefix: NewPrefix(), addr: s.Addr}
	t.Cleanup(func() { deleteKeys(s.Addr, b.Prefix) })
	return b
}

// NewPrefix returns a fresh key prefix such as "t3f9a1c2e:".
func NewPrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:]) + ":"
}

// deleteKeys removes the keys under prefix; never FLUSHDB a shared server.
func deleteKeys(addr, prefix string) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		c.Unlink(ctx, keys[:n]...)
		keys = keys[n:]
	}
}
