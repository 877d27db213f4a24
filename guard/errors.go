package guard

import (
	"errors"
	"fmt"

	"github.com/funnelguard/funnelguard/mutex"
)

// Errors returned by this package; match them with errors.Is. Errors of the
// funnel and mutex packages pass through wrapped.
var (
	// ErrUnavailable wraps the error of a call that Redis could not answer in
	// time (down, slow, failing over, or the key's lock not obtained within
	// Policy.Timeout). With FailClosed the Decision denies; with FailOpen it
	// is the Policy's rules decided in this process; with a Fallback it is
	// the fallback's. A Redis that refuses connections is decided so at
	// once, not at the end of the Timeout: the error then also matches
	// funnel.ErrUnreachable. (A closed client is ErrRejected: it will not
	// come back by itself.)
	ErrUnavailable = errors.New("guard: rate limiter unavailable")
	// ErrRejected wraps the error of a call that Redis answered with an
	// error that will not go away by itself: the client's user lacks a
	// permission (NOPERM), the server is out of memory (OOM), scripting is
	// disabled or renamed, the key holds something that is not a funnel
	// (WRONGTYPE, funnel.ErrCorruptState); or the go-redis client was closed
	// (redis.ErrClosed, at once). The Decision denies, whatever
	// OnError and Fallback say: admitting would let whoever can break a key
	// open the limit for it.
	ErrRejected = errors.New("guard: Redis refused the call")
	// ErrBusy means a call that found Policy.InFlight calls of its key
	// running, and none ending within Policy.Timeout: it did not run, and
	// the units its admission took were given back. Middleware answers 503
	// with Retry-After (ErrorRetryAfter); Enter returns it with that denial.
	ErrBusy = errors.New("guard: too many calls in flight")
	// ErrInvalidKey means an empty key, one over MaxKeyLen, or one the
	// Policy's Normalize rejected.
	ErrInvalidKey = errors.New("guard: invalid key")
	// ErrInvalidPolicy means a nil client or a Policy that New cannot use;
	// it is wrapped with the cause, such as funnel.ErrInvalidRule for a bad
	// rule or funnel.ErrInvalidOption for a bad Policy.Funnel option.
	ErrInvalidPolicy = errors.New("guard: invalid policy")
	// ErrPlan wraps the error of Policy.PlanOf, or a plan name that
	// Policy.Plans does not hold: the call is denied (RetryAfter
	// ErrorRetryAfter) and nothing is taken.
	ErrPlan = errors.New("guard: no plan for the key")
	// ErrNilContext is mutex.ErrNilContext: a call given a nil context,
	// which it refuses before anything else (it takes and runs nothing).
	ErrNilContext = mutex.ErrNilContext

	// Errors of the KeyFuncs of this package, each wrapped in a
	// RequestError that says what the client can fix. None quotes what the
	// client sent.

	// ErrNoKey means a request that carries no usable key: no address, a
	// missing or empty header, parameter or field, one given twice, a value
	// of the wrong type, or a body that does not parse. Middleware answers
	// 400 Bad Request.
	ErrNoKey = errors.New("guard: no key in the request")
	// ErrBodyTooLarge means a body longer than the KeyFunc reads.
	// Middleware answers 413 Content Too Large.
	ErrBodyTooLarge = errors.New("guard: request body too large")
	// ErrContentType means a body not declared with a media type the
	// KeyFunc reads. Middleware answers 415 Unsupported Media Type.
	ErrContentType = errors.New("guard: unsupported content type")
	// ErrInvalidKeyFunc means a KeyFunc built from bad arguments (Join
	// without parts, a body limit below 1): a bug of the server, which
	// Middleware answers with 500.
	ErrInvalidKeyFunc = errors.New("guard: invalid key function")
)

// A RequestError is an error the client can fix. Fix says what to fix, for
// the client ("missing field \"phone\""): it names no Go identifier and
// never quotes what the client sent. Err is the error for the server,
// matching ErrNoKey, ErrBodyTooLarge, ErrContentType or another package's
// error. Middleware answers with Fix as the body's "error"; a KeyFunc's
// error with no RequestError in its chain is answered "invalid request
// key", so that no error chain reaches the client.
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

// fixOf is the Fix of the first RequestError in err's chain, or def.
func fixOf(err error, def string) string {
	var re *RequestError
	if errors.As(err, &re) && re.Fix != "" {
		return re.Fix
	}
	return def
}
