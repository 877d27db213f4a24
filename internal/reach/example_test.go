package reach_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/funnelguard/funnelguard/internal/reach"
)

// A refused dial means the server is unreachable; a deadline does not
// (the server may have run the command).
func ExampleUnreachable() {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	fmt.Println(reach.Unreachable(refused))
	fmt.Println(reach.Unreachable(context.DeadlineExceeded))
	fmt.Println(errors.Is(reach.Mark(refused), reach.ErrUnreachable))
	// Output:
	// true
	// false
	// true
}
