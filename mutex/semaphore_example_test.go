package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/mutex"
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
	big, err := sem.Acquire(ctx, 2, mutex.AutoRenew()) // waits while ctx allows
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
