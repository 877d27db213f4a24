package guard

import "errors"

// Errors returned by this package; match them with errors.Is. Errors of the
// funnel and mutex packages pass through wrapped.
var (
	// ErrUnavailable wraps the error of a call that Redis could not answer in
	// time (down, slow, failing over, or the key's lock not obtained within
	// Policy.Timeout). With FailClosed the Decision denies; with FailOpen it
	// is the Policy's rules decided in this process; with a Fallback it is
	// the fallback's.
	ErrUnavailable = errors.New("guard: rate limiter unavailable")
	// ErrRejected wraps the error of a call that Redis answered with an
	// error that will not go away by itself: the client's user lacks a
	// permission (NOPERM), the server is out of memory (OOM), scripting is
	// disabled or renamed, the key holds something that is not a funnel
	// (WRONGTYPE, funnel.ErrCorruptState). The Decision denies, whatever
	// OnError and Fallback say: admitting would let whoever can break a key
	// open the limit for it.
	ErrRejected = errors.New("guard: Redis refused the call")
	// ErrInvalidKey means an empty key, one over MaxKeyLen, or one the
	// Policy's Normalize rejected.
	ErrInvalidKey = errors.New("guard: invalid key")
	// ErrInvalidPolicy means a Policy that New cannot use.
	ErrInvalidPolicy = errors.New("guard: invalid policy")
)
