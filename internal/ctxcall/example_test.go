package ctxcall_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
)

// A call that outlives its context's cancellation returns at the
// cancellation with ErrAbandoned; its outcome, when it comes, goes to late.
func ExampleDo() {
	ctx, cancel := context.WithCancel(context.Background())
	hung := make(chan struct{}) // a hung server's command, until closed
	late := make(chan string, 1)
	time.AfterFunc(10*time.Millisecond, cancel)
	_, err := ctxcall.Do(ctx, ctxcall.NewWorkers(), func(context.Context) (string, error) {
		<-hung
		return "OK", nil
	}, func(v string, err error) { late <- v })
	fmt.Println(errors.Is(err, ctxcall.ErrAbandoned), errors.Is(err, context.Canceled))
	close(hung)
	fmt.Println(<-late)
	// Output:
	// true true
	// OK
}
