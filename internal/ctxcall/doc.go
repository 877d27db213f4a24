// Package ctxcall makes a Redis call return by its context's end: its
// deadline, even on a client that does not honour context deadlines, and a
// cancellation on any client.
//
// go-redis bounds a command by its context's deadline only when the client
// was made with ContextTimeoutEnabled; otherwise a hung server holds the
// caller for the client's ReadTimeout (5 s by default), and again for each
// retry. Even with it, go-redis sets socket deadlines from ctx.Deadline and
// never watches ctx.Done: a call cancelled before its deadline on a stopped
// server waits for the deadline. So a call that may end sooner than go-redis
// would let it runs in another goroutine (Workers: one kept briefly for the
// next call), and the caller leaves when its context ends, with an error
// matching ErrAbandoned; that goroutine's call ends when go-redis gives up
// (the deadline, or its own timeouts). A context that cannot end, and on a
// client that honours deadlines one that only its deadline ends
// (DeadlineOnly: a release detached from its caller's cancellation), need
// no hand-off (Runner.Direct).
//
// A clone of the client with ContextTimeoutEnabled (go-redis's WithTimeout,
// the same pool) would spare the hand-off for deadlines, but go-redis 9.23's
// clone drops the client's hooks: the user's tracing and metrics would miss
// every call.
package ctxcall
