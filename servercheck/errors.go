package servercheck

import "errors"

// Errors reported by this package. Match them with errors.Is: a Finding's
// Err wraps one of them with the server's address and the cause, and
// Check's error joins the findings' errors.
var (
	// ErrEvictionPolicy means that the server has a memory limit
	// (maxmemory) and a maxmemory-policy other than noeviction: once it is
	// full it deletes keys to make room, funnelguard's among them, and a
	// deleted limiter or lock key is a limit or a lock silently gone. The
	// volatile-* policies count too: every key funnelguard writes has a TTL.
	ErrEvictionPolicy = errors.New("servercheck: maxmemory-policy evicts funnelguard keys")
	// ErrUnknownPolicy means that the server answered but did not tell its
	// maxmemory-policy: INFO memory lacked the field (or was refused) and
	// CONFIG GET was refused too, as on some managed services, behind an
	// ACL without @dangerous, or on miniredis. The cause is wrapped too.
	ErrUnknownPolicy = errors.New("servercheck: maxmemory-policy unknown")
	// ErrNoAnswer means that the server could not be asked: a connection
	// error, or no reply by the context's deadline (then ctx.Err() is
	// wrapped too).
	ErrNoAnswer = errors.New("servercheck: no answer from the server")
	// ErrNilClient means Check was given a nil client, typed or not.
	ErrNilClient = errors.New("servercheck: nil client")
)
