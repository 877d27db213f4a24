package guard

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/funnelguard/funnelguard/mutex"
)

// Errors returned by this package; match them with errors.Is. Errors of the
// funnel and mutex packages pass through wrapped.
var (
	// ErrUnavailable wraps the error of a call Redis could not answer in
	// time (down, slow, failing over, the key's lock busy past Timeout);
	// the Decision is OnError's or the Fallback's. A refused connection is
	// decided so at once, and matches funnel.ErrUnreachable too.
	ErrUnavailable = errors.New("guard: rate limiter unavailable")
	// ErrRejected wraps an answer that will not change by itself (NOPERM,
	// OOM, scripting disabled, WRONGTYPE, funnel.ErrCorruptState) or a
	// closed client: the call is denied whatever WithOnError and WithFallback say,
	// so that breaking a key cannot open its limit.
	ErrRejected = errors.New("guard: Redis refused the call")
	// ErrBusy means WithInFlight calls of the key ran and none ended
	// within Timeout: the call did not run, and its units were given back.
	ErrBusy = errors.New("guard: too many calls in flight")
	// ErrInvalidKey means an empty key, one over MaxKeyLen, or one the
	// WithNormalize function rejected.
	ErrInvalidKey = errors.New("guard: invalid key")
	// ErrInvalidOption means a nil client, or a nil or bad Option to New,
	// wrapped with the cause (funnel.ErrInvalidRule, funnel.ErrInvalidOption).
	ErrInvalidOption = errors.New("guard: invalid option")
	// ErrPlan wraps the error of WithPlans' planOf, or a plan name the
	// plans do not hold: the call is denied (RetryAfter ErrorRetryAfter) and
	// nothing is taken.
	ErrPlan = errors.New("guard: no plan for the key")
	// ErrNilContext is mutex.ErrNilContext: a nil context, refused before
	// anything else.
	ErrNilContext = mutex.ErrNilContext

	// Errors of this package's KeyFuncs, each in a RequestError.

	// ErrNoKey means a request without a usable key: none, an empty one,
	// one given twice or of the wrong type, a body that does not parse
	// (Middleware: 400).
	ErrNoKey = errors.New("guard: no key in the request")
	// ErrBodyTooLarge means a body longer than the KeyFunc reads (413).
	ErrBodyTooLarge = errors.New("guard: request body too large")
	// ErrContentType means a body not declared with a media type the
	// KeyFunc reads (415).
	ErrContentType = errors.New("guard: unsupported content type")
	// ErrInvalidKeyFunc means a KeyFunc built from bad arguments: a bug of
	// the server (500).
	ErrInvalidKeyFunc = errors.New("guard: invalid key function")
)

// A RequestError is an error the client can fix. Fix says what, for the
// client ("missing field \"phone\""), naming no Go identifier and quoting
// nothing it sent; Err is for the server. Middleware answers with Fix, and
// a KeyFunc error without a RequestError with "invalid request key".
type RequestError struct {
	Fix string
	Err error
}

func (e *RequestError) Error() string {
	if e.Err == nil {
		return e.Fix
	}
	return e.Err.Error()
}

func (e *RequestError) Unwrap() error { return e.Err }

// fixable is a RequestError that says fix, with the error sentinel: fix.
func fixable(sentinel error, fix string) error {
	return &RequestError{Fix: fix, Err: fmt.Errorf("%w: %s", sentinel, fix)}
}

func fixOf(err error, def string) string {
	var re *RequestError
	if errors.As(err, &re) {
		return cmp.Or(re.Fix, def)
	}
	return def
}
