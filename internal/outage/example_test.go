package outage_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/funnelguard/funnelguard/internal/reach"
)

// A call whose dial was refused makes the Watch down: the next call ends
// at once with the refusal, without running.
func ExampleWatch_Run() {
	dial := func(context.Context) (net.Conn, error) { return nil, refusal() }
	w := outage.New(dial, time.Second)
	err := w.Run(context.Background(), time.Second, func(context.Context) error { return refusal() })
	fmt.Println(w.Down(), reach.Unreachable(err))
	ran := false
	err = w.Run(context.Background(), time.Second, func(context.Context) error { ran = true; return nil })
	fmt.Println(ran, errors.Is(err, reach.ErrUnreachable))
	// Output:
	// true true
	// false true
}
