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
	// ErrInvalidRule means a rule with a field out of range, or numbers so
	// large that exact arithmetic would overflow; or no rules, or two rules
	// of one call with one name or state.
	ErrInvalidRule = errors.New("funnel: invalid rule")
	// ErrInvalidN means n < 1, or (AllowN) n larger than a rule's Capacity.
	ErrInvalidN = errors.New("funnel: invalid n")
	// ErrCorruptState means the key's stored state cannot be read.
	ErrCorruptState = errors.New("funnel: corrupt state")
	// ErrConflict means the lock's lease kept lapsing before the commit
	// (too short for the round trips); never an outage.
	ErrConflict = errors.New("funnel: commit kept losing the lock")
	// ErrInvalidOption means a nil client or a bad option to New.
	ErrInvalidOption = errors.New("funnel: invalid option")
	// ErrUnreachable is mutex.ErrUnreachable: Redis cannot be reached
	// now. A call, and the calls batched with it, end on it at once.
	ErrUnreachable = mutex.ErrUnreachable
	// ErrNilContext is mutex.ErrNilContext: a call given a nil context
	// changes nothing.
	ErrNilContext = mutex.ErrNilContext
)

// errNilLimiter is the error of a call on a nil *Limiter.
var errNilLimiter = fmt.Errorf("%w: nil Limiter", ErrInvalidOption)

// errLate answers an admission whose write came, or would come, past the
// call's deadline (serverclock.go): it took nothing.
var errLate = fmt.Errorf("funnel: the admission's write came past the call's deadline, and took nothing: %w", context.DeadlineExceeded)
