package mutex

import (
	"errors"
	"fmt"

	"github.com/funnelguard/funnelguard/internal/reach"
)

// Errors returned by this package. Match them with errors.Is: a call may wrap
// or join them with the cause (a Redis error, ctx.Err()).
var (
	// ErrInvalid means a bad argument: a nil client or context, a bad
	// option to New or NewQuorum (a lease or retry interval under 1 ms or
	// over MaxTTL, a prefix with a brace or over 256 bytes, too few or
	// repeated quorum clients, a bad replica acknowledgement), a lease out
	// of those bounds, an empty name or one over MaxNameLen, a semaphore
	// size under 1 or over MaxSemaphoreSize, a Call without a Fragment. It
	// is wrapped with what was wrong: the error says which argument, the
	// sentinel is for errors.Is.
	ErrInvalid = errors.New("mutex: invalid argument")
	// ErrLocked means another owner holds the lock (TryLock).
	ErrLocked = errors.New("mutex: locked by another owner")
	// ErrNotObtained means Lock gave up waiting; it is joined with ctx.Err().
	ErrNotObtained = errors.New("mutex: not obtained")
	// ErrNotHeld means the lock is no longer held by this handle: it was
	// unlocked already, its lease expired, or another owner has it now.
	ErrNotHeld = errors.New("mutex: not held")
	// ErrLockLost is the cause (context.Cause) of a Lock's context when the
	// lease ended or the lock was found taken while the holder still held the
	// handle.
	ErrLockLost = errors.New("mutex: lock lost")
	// ErrDeclined means a gate (NewGate) declined the acquire attempt: no
	// lock was taken, and the gate's result comes with the error.
	ErrDeclined = errors.New("mutex: declined by the gate")
	// ErrUnsupported means a feature that this Locker cannot offer: a
	// Fragment on a quorum Locker (its data must live in the lock's one
	// Redis), or WithReplicaAck with a client that cannot hold a connection
	// for WAIT (New's error).
	ErrUnsupported = errors.New("mutex: not supported by this Locker")
	// ErrNoQuorum means a quorum call could not reach a majority of nodes in
	// time; it is joined with the failed nodes' errors.
	ErrNoQuorum = errors.New("mutex: no quorum")
	// ErrResultUnknown means UnlockWith ran the fragment and released the
	// handle, but Redis's reply was lost and the retry that found the work
	// done could not recover the fragment's result (a table: only numbers,
	// strings and booleans are kept for a retry).
	ErrResultUnknown = errors.New("mutex: fragment ran, its result was lost with the reply")
	// ErrUnexpectedReply means Redis answered a script with a reply of the
	// wrong shape (for example a key prefix shared with other data).
	ErrUnexpectedReply = errors.New("mutex: unexpected reply from Redis")
	// ErrNotReplicated means a write that grants or keeps a lock (or a
	// fragment's write on release) was not acknowledged by as many replicas
	// as WithReplicaAck asks within its bound. An acquisition is undone
	// first (the lock released); see WithReplicaAck for the others.
	ErrNotReplicated = errors.New("mutex: not acknowledged by enough replicas")
	// ErrUnreachable means Redis cannot be reached now: the connection was
	// refused or found no route to the host, or the client was closed
	// (redis.ErrClosed). It is joined with go-redis's error. The command
	// never reached Redis, so a call ends on it at once, whatever time its
	// context has left: Lock and LockWith stop waiting, and this Locker's
	// other calls waiting for the same name, or queued to be sent with it,
	// get the same error at once. A server that does not answer (hung,
	// paused, a dropped network) is not unreachable: the call waits for it
	// until its context ends. A quorum Locker's errors never match it.
	ErrUnreachable = reach.ErrUnreachable
)

// ErrNilContext is the error of a call given a nil context; it matches
// ErrInvalid. The call checked it before anything else: it changed nothing,
// in Redis or in the handle.
var ErrNilContext = fmt.Errorf("%w: nil context", ErrInvalid)

// errNilLocker is the error of a call on a nil *Locker (New failed, and its
// error was not checked).
var errNilLocker = fmt.Errorf("%w: nil Locker", ErrInvalid)
