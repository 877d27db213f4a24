package funnel

import "errors"

// Errors returned by this package; match them with errors.Is.
var (
	// ErrInvalidKey means an empty key or one longer than MaxKeyLen.
	ErrInvalidKey = errors.New("funnel: invalid key")
	// ErrInvalidRule means a rule with no name, a Capacity, Leak or Per that
	// is not positive, a Per that is not a whole number of microseconds, or
	// numbers so large that exact arithmetic would overflow; or no rules.
	ErrInvalidRule = errors.New("funnel: invalid rule")
	// ErrDuplicateRule means two rules of one call share a name.
	ErrDuplicateRule = errors.New("funnel: duplicate rule name")
	// ErrInvalidN means n < 1, or (AllowN) n larger than a rule's Capacity:
	// such a call could never be admitted.
	ErrInvalidN = errors.New("funnel: invalid n")
	// ErrCorruptState means the key's stored state cannot be read (another
	// program wrote to it).
	ErrCorruptState = errors.New("funnel: corrupt state")
	// ErrConflict means the commit kept failing because the lock's lease
	// lapsed before each commit (the lease is too short for the round trips).
	ErrConflict = errors.New("funnel: commit kept losing the lock")
	// ErrNilClient means New was given no client.
	ErrNilClient = errors.New("funnel: nil client")
	// ErrInvalidOption means a bad option to New.
	ErrInvalidOption = errors.New("funnel: invalid option")
)
