package mutex_test

import (
	"context"
	"testing"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// BenchmarkSemaphoreQuorum is an uncontended TryAcquire + Release on one
// Redis and on a quorum of 3 (each call one round trip to every node at
// once): what the quorum costs a holder.
func BenchmarkSemaphoreQuorum(b *testing.B) {
	srvs := testutil.StartServers(b, 3)
	var clients []mutex.Client
	for _, s := range srvs {
		c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
		b.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	single, err := mutex.New(clients[0], mutex.WithPrefix(testutil.NewPrefix()))
	if err != nil {
		b.Fatal(err)
	}
	quorum, err := mutex.NewQuorum(clients, mutex.WithPrefix(testutil.NewPrefix()), mutex.WithNodeTimeout(quorumNodeTimeout))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		l    *mutex.Locker
	}{{"single", single}, {"quorum3", quorum}} {
		b.Run(c.name, func(b *testing.B) {
			semCycles(b, context.Background(), mustSem(b, c.l, "bench", 2))
		})
	}
}
