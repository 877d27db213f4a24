package mutex

import (
	"errors"
	"fmt"

	"github.com/funnelguard/funnelguard/internal/reach"
)

// Errors returned by this package. Match them with errors.Is: a call may wrap
// or join them with the cause (a Redis error, ctx.Err()).
var (
	// ErrInvalid means a bad argument or option; the error says which.
	ErrInvalid = errors.New("mutex: invalid argument")
	// ErrLocked means another owner holds the lock (TryLock).
	ErrLocked = errors.New("mutex: locked by another owner")
	// ErrNotObtained means Lock gave up waiting; it is joined with ctx.Err().
	ErrNotObtained = errors.New("mutex: not obtained")
	// ErrNotHeld means this handle no longer holds the lock: it was
	// unlocked, its lease expired, or another owner has it now.
	ErrNotHeld = errors.New("mutex: not held")
	// ErrLockLost is the cause (context.Cause) of a Lock's context when the
	// lock was lost before it was unlocked.
	ErrLockLost = errors.New("mutex: lock lost")
	// ErrDeclined means a gate (NewGate) declined the attempt: no lock was
	// taken, and the gate's result comes with the error.
	ErrDeclined = errors.New("mutex: declined by the gate")
	// ErrUnsupported means a feature this Locker or client cannot offer.
	ErrUnsupported = errors.New("mutex: not supported by this Locker")
	// ErrNoQuorum means a quorum call could not reach a majority of nodes in
	// time; it is joined with the failed nodes' errors.
	ErrNoQuorum = errors.New("mutex: no quorum")
	// ErrResultUnknown means UnlockWith ran the fragment and released the
	// handle, but the reply was lost and the result was a table, which a
	// retry cannot recover.
	ErrResultUnknown = errors.New("mutex: fragment ran, its result was lost with the reply")
	// ErrUnexpectedReply means Redis answered a script with a reply of the
	// wrong shape (for example a key prefix shared with other data).
	ErrUnexpectedReply = errors.New("mutex: unexpected reply from Redis")
	// ErrNotReplicated means too few replicas acknowledged a write
	// (WithReplicaAck); an acquisition is undone first.
	ErrNotReplicated = errors.New("mutex: not acknowledged by enough replicas")
	// ErrUnreachable means the command never reached Redis (connection
	// refused, no route, client closed): the call, and Lock's wait, end on
	// it at once. A server that does not answer is not unreachable. A
	// quorum Locker's errors never match it.
	ErrUnreachable = reach.ErrUnreachable
)

// ErrNilContext is the error of a call given a nil context, which changed
// nothing; it matches ErrInvalid.
var ErrNilContext = fmt.Errorf("%w: nil context", ErrInvalid)

var errNilLocker = fmt.Errorf("%w: nil Locker", ErrInvalid)
