package mutex

import (
	"context"
	"time"
)

// A deployment is where a Locker keeps its locks: one Redis deployment
// (single, made by New: a server, a failover group or a cluster) or a quorum
// of independent masters (*quorum, made by NewQuorum). The constructors
// choose it once; every call that differs between the two goes through it,
// so no other code asks which Locker it is.
type deployment interface {
	// nodeCount is Locker.Nodes: 1, or the quorum's masters.
	nodeCount() int
	// unsupported refuses what cannot run on the deployment (what names
	// it): nil, or an error matching ErrUnsupported.
	unsupported(what string) error
	// acquire runs the acquire script of l (a fragment's, if call) for
	// n's token, sent at start; arg is acquire.lua's ARGV[2]: argFresh or
	// argMark for a fresh token (argMark: mark a held lock), a handle id
	// for a re-entry. It returns the script's reply, {1, lease, fence} or
	// {0, pttl, 0}, and the fragment's result.
	acquire(ctx context.Context, l *Locker, name string, n *names, cfg lockConfig, call *Call, arg any, start time.Time) ([3]int64, any, error)
	// extend sets the lease of h's handle id ("" for any handle: renewal);
	// false when the lock is no longer held.
	extend(ctx context.Context, h *hold, id string, lease time.Duration, start time.Time) (bool, error)
	// pttl reads the lease lk's lock has left, or ErrNotHeld.
	pttl(ctx context.Context, lk *Lock) (time.Duration, error)
	// release runs a release of a handle that won the move to releasing:
	// its result (a fragment's) or error.
	release(ctx context.Context, r *release) (any, error)
	// spend is called when h's last handle released the lock (retrysafety.go).
	spend(h *hold)
	// semaphores returns how a semaphore of size permits is kept, or
	// ErrUnsupported.
	semaphores(size int64) (semDeployment, error)
}

// single is the deployment of a Locker made by New: every call is one
// script (or command) on the Locker's client.
type single struct{}

func (single) nodeCount() int { return 1 }

func (single) unsupported(string) error { return nil }

func (single) semaphores(int64) (semDeployment, error) { return single{}, nil }

// unsupported rejects the calls the Locker's deployment cannot make (a nil
// Locker's calls fail on their own).
func (l *Locker) unsupported(what string) error {
	if l == nil {
		return nil
	}
	return l.dep.unsupported(what)
}

// Nodes reports how many Redis deployments the Locker keeps its locks on: 1
// for New, N for NewQuorum.
func (l *Locker) Nodes() int { return l.dep.nodeCount() }

// A semDeployment is how a Semaphore is kept: on one Redis (single), with
// FIFO waiters, or on a quorum's nodes (semQuorum), whose waiters poll.
type semDeployment interface {
	// semTry is TryAcquire's attempt for tok.
	semTry(ctx context.Context, s *Semaphore, tok string, n int64, cfg lockConfig) (*Permit, error)
	// semWait is Acquire once its call is checked.
	semWait(ctx context.Context, s *Semaphore, n int64, cfg lockConfig) (*Permit, error)
	// semRelease runs the release script for tok in mode ("": release;
	// "c": cancel) and answers semReleased or semNotHolder.
	semRelease(ctx context.Context, s *Semaphore, tok, mode string) (int64, error)
	// semExtend sets the lease of p's permits to d and records it; false
	// when they are no longer held.
	semExtend(ctx context.Context, p *Permit, d time.Duration) (bool, error)
}
