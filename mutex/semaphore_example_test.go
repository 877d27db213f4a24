package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// A semaphore of 3 permits shared by every process that uses the name:
// weighted acquisitions, FIFO waiting, leases that come back if a holder
// crashes.
func ExampleLocker_Semaphore() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()

	locker, err := mutex.New(client, mutex.WithTTL(10*time.Second))
	if err != nil {
		fmt.Println("new:", err)
		return
	}
	sem, err := locker.Semaphore("exports", 3)
	if err != nil {
		fmt.Println("semaphore:", err)
		return
	}
	big, err := sem.Acquire(ctx, 2, mutex.WithAutoRenew()) // waits while ctx allows
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	fmt.Println("holding", big.N())

	if _, err := sem.TryAcquire(ctx, 2); errors.Is(err, mutex.ErrNoPermits) {
		fmt.Println("2 more: no permits")
	}
	one, err := sem.TryAcquire(ctx, 1)
	if err != nil {
		fmt.Println("try:", err)
		return
	}
	fmt.Println("holding", big.N()+one.N())

	// Work that must stop when the permits are lost runs under this context.
	work := big.Context(ctx)
	_ = work

	fmt.Println(big.Release(ctx), one.Release(ctx))
	fmt.Println(big.Release(ctx))
	// Output:
	// holding 2
	// 2 more: no permits
	// holding 3
	// <nil> <nil>
	// mutex: not held
}

// How many of M independent masters must grant a semaphore's acquisition
// on a quorum Locker (NewQuorum): a majority only for a size of 1.
func ExampleSemaphoreQuorum() {
	for _, c := range []struct {
		nodes int
		size  int64
	}{{3, 1}, {3, 2}, {5, 2}, {5, 4}} {
		q, _ := mutex.SemaphoreQuorum(c.nodes, c.size)
		fmt.Printf("M=%d N=%d: Q=%d, survives %d nodes down\n", c.nodes, c.size, q, c.nodes-q)
	}
	// Output:
	// M=3 N=1: Q=2, survives 1 nodes down
	// M=3 N=2: Q=3, survives 0 nodes down
	// M=5 N=2: Q=4, survives 1 nodes down
	// M=5 N=4: Q=5, survives 0 nodes down
}

// A semaphore on a quorum of 3 masters: with 2 permits, every node must
// grant (Q = 3), so the count holds whatever the nodes; it needs them all.
func ExampleLocker_Semaphore_quorum() {
	var clients []mutex.Client
	for range 3 { // three independent masters
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			panic(err)
		}
		defer m.Close()
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
		defer c.Close()
		clients = append(clients, c)
	}
	ctx := context.Background()
	locker, err := mutex.NewQuorum(clients, mutex.WithTTL(10*time.Second), mutex.WithNodeTimeout(500*time.Millisecond))
	if err != nil {
		fmt.Println("quorum:", err)
		return
	}
	sem, err := locker.Semaphore("sms-provider", 2)
	if err != nil {
		fmt.Println("semaphore:", err)
		return
	}
	a, _ := sem.TryAcquire(ctx, 1)
	b, _ := sem.TryAcquire(ctx, 1)
	_, err = sem.TryAcquire(ctx, 1)
	fmt.Println("third:", errors.Is(err, mutex.ErrNoPermits))
	fmt.Println("release:", a.Release(ctx), b.Release(ctx))
	// Output:
	// third: true
	// release: <nil> <nil>
}
