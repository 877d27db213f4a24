package mutex

import (
	"context"
	"time"
)

// A deployment is where a Locker keeps its locks: one Redis (single) or a
// quorum (*quorum), chosen by the constructor so no other code asks.
type deployment interface {
	nodeCount() int
	// unsupported returns an error matching ErrUnsupported for what
	// cannot run on the deployment.
	unsupported(what string) error
	// acquire runs the acquire script (a fragment's, if call) for n's
	// token, sent at start; arg is argFresh, argMark or a re-entry's handle
	// id. It returns {1, lease, fence} or {0, pttl, 0}, and the result.
	acquire(ctx context.Context, l *Locker, name string, n *names, cfg lockConfig, call *Call, arg any, start time.Time) ([3]int64, any, error)
	// extend sets the lease of h's handle id (argFresh for any: renewal);
	// false when the lock is no longer held.
	extend(ctx context.Context, h *hold, id any, lease time.Duration, start time.Time) (bool, error)
	pttl(ctx context.Context, lk *Lock) (time.Duration, error)
	release(ctx context.Context, r *release) (any, error)
	spend(h *hold) // h's last handle released the lock (retrysafety.go)
	semaphores(size int64) (semDeployment, error)
}

// single is the deployment of New: one script or command per call.
type single struct{}

func (single) nodeCount() int { return 1 }

func (single) unsupported(string) error { return nil }

func (single) semaphores(int64) (semDeployment, error) { return single{}, nil }

// Nodes reports how many Redis deployments the Locker keeps its locks on: 1
// for New, N for NewQuorum.
func (l *Locker) Nodes() int { return l.dep.nodeCount() }

// A semDeployment is how a Semaphore is kept: on one Redis (single), with
// FIFO waiters, or on a quorum's nodes (semQuorum), whose waiters poll.
type semDeployment interface {
	semTry(ctx context.Context, s *Semaphore, tok string, n int64, cfg lockConfig) (*Permit, error)
	semWait(ctx context.Context, s *Semaphore, n int64, cfg lockConfig) (*Permit, error)
	// semRelease runs the release script for tok in mode ("": release;
	// "c": cancel); false when tok held no permits.
	semRelease(ctx context.Context, s *Semaphore, tok, mode string) (bool, error)
	// semExtend sets the lease of p's permits to d; false when no longer held.
	semExtend(ctx context.Context, p *Permit, d time.Duration) (bool, error)
}
