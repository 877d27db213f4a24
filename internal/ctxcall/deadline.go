package ctxcall

import (
	"context"
	"time"
)

// DeadlineOnly returns context.WithDeadline(parent, d), marked, when parent
// cannot end (parent.Done() is nil), as a context that only its deadline
// ends: a Runner on a client that honours deadlines then sends its commands
// from the caller's goroutine, with no hand-off. Its cancel function may
// still be called before the deadline by code that does not need the call
// to end at once (a refusal seen by an outage watch: the server is gone,
// and its connections with it). When parent can end, the context is not
// marked.
func DeadlineOnly(parent context.Context, d time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithDeadline(parent, d)
	if parent.Done() != nil {
		return ctx, cancel
	}
	return deadlineOnly{ctx}, cancel
}

// deadlineOnly marks a context that only its deadline ends (DeadlineOnly).
type deadlineOnly struct{ context.Context }
