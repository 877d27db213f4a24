package servercheck_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/servercheck"
	"github.com/redis/go-redis/v9"
)

// A start-up check: refuse to start on a server that may evict
// funnelguard's keys. miniredis, the in-process Redis of this example,
// tells neither INFO memory nor CONFIG GET, so its policy is unknown: a
// program decides whether to run anyway (here it does, saying so).
func ExampleCheck() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	findings, err := servercheck.Check(ctx, client)
	switch {
	case errors.Is(err, servercheck.ErrEvictionPolicy):
		fmt.Println("refusing to start:", err) // the error names the server and the fix
		return
	case errors.Is(err, servercheck.ErrNoAnswer):
		fmt.Println("Redis is unavailable:", err)
		return
	case errors.Is(err, servercheck.ErrUnknownPolicy):
		fmt.Println("cannot tell whether Redis evicts: make sure its maxmemory-policy is noeviction")
	}
	for _, f := range findings {
		fmt.Printf("policy %q, maxmemory %d\n", f.Policy, f.MaxMemory)
	}
	// Output:
	// cannot tell whether Redis evicts: make sure its maxmemory-policy is noeviction
	// policy "", maxmemory -1
}

// Findings are one per server: report each, the safe ones' notes too.
// (These are made up: a real list comes from Check.)
func ExampleFinding() {
	findings := []servercheck.Finding{
		{Addr: "10.0.0.1:6379", MaxMemory: 0, Policy: "allkeys-lru",
			Note: "maxmemory-policy allkeys-lru evicts funnelguard keys once a memory limit (maxmemory) is set: set maxmemory-policy noeviction"},
		{Addr: "10.0.0.2:6379", MaxMemory: 1 << 30, Policy: "noeviction"},
		{Addr: "10.0.0.3:6379", MaxMemory: 1 << 30, Policy: "volatile-ttl",
			Err: fmt.Errorf("%w: 10.0.0.3:6379 has maxmemory-policy volatile-ttl and maxmemory 1073741824 bytes: set maxmemory-policy noeviction", servercheck.ErrEvictionPolicy)},
	}
	for _, f := range findings {
		switch {
		case errors.Is(f.Err, servercheck.ErrEvictionPolicy):
			fmt.Println(f.Addr, "evicts")
		case f.Err != nil:
			fmt.Println(f.Addr, "unknown:", f.Err)
		case f.Note != "":
			fmt.Println(f.Addr, "safe for now:", f.Policy, "without maxmemory")
		default:
			fmt.Println(f.Addr, "safe")
		}
	}
	// Output:
	// 10.0.0.1:6379 safe for now: allkeys-lru without maxmemory
	// 10.0.0.2:6379 safe
	// 10.0.0.3:6379 evicts
}
