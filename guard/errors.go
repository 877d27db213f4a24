package guard

import "errors"

// Errors returned by this package; match them with errors.Is. Errors of the
// funnel and mutex packages pass through wrapped.
var (
	// ErrUnavailable wraps the error of a call that Redis could not answer in
	// time (down, slow, or the key's lock not obtained within Policy.Timeout).
	// With FailClosed the Decision denies; with FailOpen it admits; with a
	// Fallback it is the fallback's.
	ErrUnavailable = errors.New("guard: rate limiter unavailable")
	// ErrInvalidKey means an empty key, one over MaxKeyLen, or one the
	// Policy's Normalize rejected.
	ErrInvalidKey = errors.New("guard: invalid key")
	// ErrInvalidPolicy means a Policy that New cannot use.
	ErrInvalidPolicy = errors.New("guard: invalid policy")
)
