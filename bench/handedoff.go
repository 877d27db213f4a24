package main

import (
	"context"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
)

// handedOff is a peer's subject given funnelguard's cancellation promise:
// each op runs in a worker goroutine (internal/ctxcall, as the library
// runs a call whose context can be cancelled before its deadline, so that
// the caller returns at the cancellation even with the server hung), and
// the caller waits for it or for its context's end. Against the peer
// itself it is what the promise costs any library: in the serial cases
// funnelguard makes one such call per op (a Lock, an Allow, an Acquire;
// the releases are timed with context.WithoutCancel, as the peers'), so
// its ratio to the peer cannot pass this subject's.
func handedOff(prepare func(context.Context, *env) (workload, error)) func(context.Context, *env) (workload, error) {
	return func(ctx context.Context, e *env) (workload, error) {
		w, err := prepare(ctx, e)
		workers, op := ctxcall.NewWorkers(), w.op
		w.op = func(ctx context.Context, g, i int) error {
			_, err := ctxcall.Do(ctx, workers, func(ctx context.Context) (struct{}, error) { return struct{}{}, op(ctx, g, i) }, nil)
			return err
		}
		return w, err
	}
}

// handedOffName names the subject of handedOff(peer).
func handedOffName(peer string) string { return peer + ", handed off" }
