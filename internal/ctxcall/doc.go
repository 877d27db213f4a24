// Package ctxcall makes a Redis call return by its context's deadline even
// on a client that does not honour context deadlines.
//
// go-redis bounds a command by its context only when the client was made
// with ContextTimeoutEnabled; otherwise a hung server holds the caller for
// the client's ReadTimeout (5 s by default), and again for each retry. The
// libraries accept such clients all the same: a call on one runs in another
// goroutine (Workers: one kept briefly for the next call), and the caller
// leaves when its context ends, with an error that names the option. That
// goroutine's call ends when go-redis gives up on its own timeouts.
//
// A clone of the client with ContextTimeoutEnabled (go-redis's WithTimeout,
// the same pool) would spare the hand-off, but go-redis 9.23's clone drops
// the client's hooks: the user's tracing and metrics would miss every call.
package ctxcall
