package ctxcall

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Runner runs scripts on a client so that each ends by its context's end:
// from the caller's goroutine when the client honours deadlines or the
// context cannot end, else under Do.
type Runner struct {
	scripter redis.Scripter
	workers  *Workers // nil: the client bounds commands by ctx's deadline
}

// NewRunner returns the Runner of client.
func NewRunner(client redis.Scripter) Runner {
	r := Runner{scripter: client}
	if !Honours(client) {
		r.workers = NewWorkers()
	}
	return r
}

// Workers is what Do needs for a call on the client: nil when the client
// honours deadlines.
func (r Runner) Workers() *Workers { return r.workers }

// Scripter is the client to send a command on when Direct reports true.
func (r Runner) Scripter() redis.Scripter { return r.scripter }

// Direct reports whether a command sent on Scripter from the caller's
// goroutine ends by ctx's end.
func (r Runner) Direct(ctx context.Context) bool {
	return r.workers == nil || ctx.Done() == nil
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
