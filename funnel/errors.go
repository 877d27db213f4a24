package funnel

import (
	"context"
	"errors"
	"fmt"

	"github.com/funnelguard/funnelguard/mutex"
)

// Errors returned by this package; match them with errors.Is.
var (
	// ErrInvalidKey means an empty key or one longer than MaxKeyLen.
	ErrInvalidKey = errors.New("funnel: invalid key")
	// ErrInvalidRule means a rule with no name, a Capacity, Leak or Per that
	// is not positive, a Per that is not a whole number of microseconds, or
	// numbers so large that exact arithmetic would overflow; or no rules, or
	// two rules of one call with one name.
	ErrInvalidRule = errors.New("funnel: invalid rule")
	// ErrInvalidN means n < 1, or (AllowN) n larger than a rule's Capacity:
	// such a call could never be admitted.
	ErrInvalidN = errors.New("funnel: invalid n")
	// ErrCorruptState means the key's stored state cannot be read (another
	// program wrote to it).
	ErrCorruptState = errors.New("funnel: corrupt state")
	// ErrConflict means the commit kept failing because the lock's lease
	// lapsed before each commit (the lease is too short for the round trips).
	// It never stands for an outage: a call on a Redis that refuses or does
	// not answer ends with ErrUnreachable or its context's error.
	ErrConflict = errors.New("funnel: commit kept losing the lock")
	// ErrInvalidOption means a nil client or a bad option to New; it is
	// wrapped with what was wrong.
	ErrInvalidOption = errors.New("funnel: invalid option")
	// ErrUnreachable is mutex.ErrUnreachable: Redis cannot be reached now
	// (the connection was refused, the client closed). A call ends on it at
	// once, and so do the calls batched with it (they would hear the same);
	// a hung server costs a call its deadline instead.
	ErrUnreachable = mutex.ErrUnreachable
	// ErrNilContext is mutex.ErrNilContext: a call given a nil context,
	// which it refuses before anything else (it changes nothing).
	ErrNilContext = mutex.ErrNilContext
)

// errNilLimiter is the error of a call on a nil *Limiter (New failed, and
// its error was not checked).
var errNilLimiter = fmt.Errorf("%w: nil Limiter", ErrInvalidOption)

// errLate answers an admission whose write Redis refused, or would refuse,
// because it ran past the server time that the call's deadline stands for
// (serverclock.go): nothing was taken, as for any call that ran out of time.
var errLate = fmt.Errorf("funnel: the admission's write came past the call's deadline, and took nothing: %w", context.DeadlineExceeded)

// isLate reports whether write.lua's reply says it was refused as late (a
// negative server time).
func isLate(reply any) bool {
	n, ok := reply.(int64)
	return ok && n < 0
}
