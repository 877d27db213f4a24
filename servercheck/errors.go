package servercheck

import "errors"

// Errors reported by this package; match them with errors.Is. A Finding's
// Err wraps one with the server's address and the cause.
var (
	// ErrEvictionPolicy means a memory limit and a maxmemory-policy other
	// than noeviction: once full, the server deletes funnelguard's keys.
	ErrEvictionPolicy = errors.New("servercheck: maxmemory-policy evicts funnelguard keys")
	// ErrUnknownPolicy means the server answered but did not tell its
	// maxmemory-policy (INFO memory and CONFIG GET both refused or silent,
	// as on some managed services or miniredis); the cause is wrapped.
	ErrUnknownPolicy = errors.New("servercheck: maxmemory-policy unknown")
	// ErrNoAnswer means the server could not be asked: a connection error,
	// or no reply by the context's deadline (with ctx.Err()).
	ErrNoAnswer = errors.New("servercheck: no answer from the server")
	// ErrNilClient means Check was given a nil client, typed or not.
	ErrNilClient = errors.New("servercheck: nil client")
)
