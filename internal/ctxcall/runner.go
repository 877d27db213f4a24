package ctxcall

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Runner runs scripts on a client so that each ends by its context's end,
// a cancellation included: from the caller's goroutine when that is enough
// (Direct), else under Do.
type Runner struct {
	scripter redis.Scripter
	workers  *Workers
	honours  bool // the client bounds commands by ctx's deadline (Honours)
}

// NewRunner returns the Runner of client. It starts no goroutine: its
// Workers start one at the first call handed to them.
func NewRunner(client redis.Scripter) Runner {
	return Runner{scripter: client, workers: NewWorkers(), honours: Honours(client)}
}

// Workers is what Do needs for a call under ctx on the client: nil when
// Direct(ctx).
func (r Runner) Workers(ctx context.Context) *Workers {
	if r.Direct(ctx) {
		return nil
	}
	return r.workers
}

// Scripter is the client to send a command on when Direct reports true.
func (r Runner) Scripter() redis.Scripter { return r.scripter }

// Direct reports whether a command sent on Scripter from the caller's
// goroutine ends by ctx's end: ctx cannot end, or the client honours
// deadlines and only ctx's deadline ends it (DeadlineOnly). A client that
// honours deadlines still reads a stopped server's socket until the
// deadline after a cancellation (go-redis sets socket deadlines from
// ctx.Deadline and never watches ctx.Done), so a ctx that can be cancelled
// sooner hands the call off as on any client.
func (r Runner) Direct(ctx context.Context) bool {
	if ctx.Done() == nil {
		return true
	}
	_, timed := ctx.(deadlineOnly)
	return timed && r.honours
}

// Run runs script, from the caller's goroutine when Direct, else under Do
// with late.
func (r Runner) Run(ctx context.Context, script *redis.Script, keys []string, args []any, late func(any, error)) (any, error) {
	if r.Direct(ctx) {
		return script.Run(ctx, r.scripter, keys, args...).Result()
	}
	return Do(ctx, r.workers, func(ctx context.Context) (any, error) {
		return script.Run(ctx, r.scripter, keys, args...).Result()
	}, late)
}
