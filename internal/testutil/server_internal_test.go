package testutil

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A server started on an address another server already serves fails to
// start, however fast the other answers PING: two spawns that probed the same
// free port once took one server for two (the second process could not bind
// and exited), and a quorum test then killed a node that served nothing while
// its address stayed up, and lost two of its three nodes at once.
func TestStartRefusesAnotherServersPort(t *testing.T) {
	first := StartServer(t)
	dir, err := os.MkdirTemp("", "funnelguard-redis-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	second := &Server{Addr: first.Addr, dir: dir}
	if err := second.start(); err == nil {
		second.Kill()
		t.Fatalf("a second server on %s (the first's address) started", first.Addr)
	}
	c := redis.NewClient(&redis.Options{Addr: first.Addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := answers(ctx, c, first.Pid()); err != nil {
		t.Fatalf("the first server after the second's try: %v", err)
	}
}
