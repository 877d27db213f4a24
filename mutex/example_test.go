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

// exampleClient returns a client of an in-process miniredis.
func exampleClient() (*redis.Client, func()) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	return c, func() { c.Close(); m.Close() }
}

func Example() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()

	locker, err := mutex.New(client, mutex.WithTTL(10*time.Second))
	if err != nil {
		fmt.Println("new:", err)
		return
	}
	lk, err := locker.Lock(ctx, "order:42")
	if err != nil {
		fmt.Println("lock:", err)
		return
	}
	defer lk.Unlock(ctx)

	_, err = locker.TryLock(ctx, "order:42")
	fmt.Println("a second TryLock:", errors.Is(err, mutex.ErrLocked))
	// Output: a second TryLock: true
}

// A bad option is New's error, matching ErrInvalid; New returns no Locker.
func ExampleNew() {
	client, stop := exampleClient()
	defer stop()

	_, err := mutex.New(client, mutex.WithTTL(time.Microsecond))
	fmt.Println(err)
	fmt.Println(errors.Is(err, mutex.ErrInvalid))
	// Output:
	// mutex: invalid argument: lease 1µs: want 1ms to 24h0m0s
	// true
}

func ExampleLocker_Lock_timeout() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	locker, _ := mutex.New(client) // a client and no options: no error

	holder, _ := locker.Lock(ctx, "report")
	defer holder.Unlock(ctx)

	wait, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err := locker.Lock(wait, "report")
	fmt.Println(errors.Is(err, mutex.ErrNotObtained), errors.Is(err, context.DeadlineExceeded))
	// Output: true true
}

func ExampleLock_Context() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	locker, _ := mutex.New(client) // a client and no options: no error

	outer, _ := locker.Lock(ctx, "account:7")
	owned := outer.Context(ctx) // cancelled if the lock is lost; carries ownership

	// A helper deeper in the call chain locks the same name: it re-enters.
	inner, err := locker.Lock(owned, "account:7")
	fmt.Println("re-entered:", err == nil)
	inner.Unlock(ctx)
	outer.Unlock(ctx)

	<-owned.Done()
	fmt.Println("cause:", context.Cause(owned))
	// Output:
	// re-entered: true
	// cause: mutex: not held
}

// A read-modify-write of data in Redis that can never land after the lease
// lapsed: the read rides on the acquire, the write on the release.
func ExampleFragment() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	locker, _ := mutex.New(client) // a client and no options: no error

	read := mutex.NewFragment(`return redis.call('GET', KEYS[1]) or '0'`)
	write := mutex.NewFragment(`redis.call('SET', KEYS[1], ARGV[1]) return 1`)
	key := "fg:{balance:7}:value" // the lock's {hash tag}: one cluster slot

	lk, res, err := locker.TryLockWith(ctx, "balance:7", mutex.Call{Fragment: read, Keys: []string{key}})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("read:", res)
	_, err = lk.UnlockWith(ctx, mutex.Call{Fragment: write, Keys: []string{key}, Args: []any{100}})
	fmt.Println("committed:", err == nil, client.Get(ctx, key).Val())
	// Output:
	// read: 0
	// committed: true 100
}

func ExampleNewQuorum() {
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

	// Each node's part is bounded by the node timeout; a majority that does
	// not answer within it fails the call. Keep it well below the lease.
	locker, err := mutex.NewQuorum(clients, mutex.WithTTL(10*time.Second), mutex.WithNodeTimeout(500*time.Millisecond))
	if err != nil {
		fmt.Println("quorum:", err)
		return
	}
	lk, err := locker.Lock(ctx, "report")
	if err != nil {
		fmt.Println("lock:", err)
		return
	}
	defer lk.Unlock(ctx)
	fmt.Println("held on a majority of", locker.Nodes(), "nodes")
	// Output: held on a majority of 3 nodes
}

func ExampleWithReplicaAck() {
	client, stop := exampleClient() // a master without replicas
	defer stop()
	ctx := context.Background()

	// Each acquisition, extension, hand-over and UnlockWith returns only
	// once one replica has it, within 100 ms.
	locker, err := mutex.New(client, mutex.WithReplicaAck(1, 100*time.Millisecond))
	if err != nil {
		fmt.Println("new:", err)
		return
	}
	_, err = locker.TryLock(ctx, "payout:7")
	fmt.Println("not replicated:", errors.Is(err, mutex.ErrNotReplicated))
	// The grant was undone: without the option, the name is free.
	plain, _ := mutex.New(client)
	lk, err := plain.TryLock(ctx, "payout:7")
	fmt.Println("free again:", err == nil)
	if err == nil {
		lk.Unlock(ctx)
	}
	// Output:
	// not replicated: true
	// free again: true
}
