// Package mutex is a distributed mutex kept in Redis.
//
// A Locker hands out locks on names; a Lock is one handle on a held lock:
//
//	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
//	locker, err := mutex.New(client, mutex.WithTTL(10*time.Second))
//	...
//	lk, err := locker.Lock(ctx, "order:42") // waits while ctx allows
//	if err != nil {
//		return err
//	}
//	defer lk.Unlock(ctx)
//
// What it promises:
//
//   - One owner per name: a lock is a Redis string with a lease and the
//     owner's random token, checked inside every script, so a late or
//     repeated call never touches another owner's lock.
//   - One owner inside one process: racing calls on one handle are decided
//     by one transition (one Unlock wins, the others get ErrNotHeld).
//   - Every call returns by its context's deadline, with the server hung
//     too; Unlock runs even when its context was cancelled.
//   - A call whose reply was lost and that go-redis (or the caller) runs
//     again gets the first run's answer.
//   - Nothing is left behind: every key has a TTL, and a lock whose lease
//     ended is lost, never re-acquired behind its holder (Done, Context).
//
// Options add re-entry through Lock.Context, FIFO waiting and hand-over
// between goroutines of one Locker, WithAutoRenew, fencing numbers, replica
// acknowledgement and Redlock over independent masters (NewQuorum); a
// Fragment runs the caller's Lua atomically with an acquire or a release.
//
// Locker.Semaphore gives a counting semaphore on a name, in the shape of
// golang.org/x/sync/semaphore (TryAcquire, Acquire of n permits, each
// returning a Permit to Release), with the locks' leases, WithAutoRenew,
// Done and Context, fencing and retry-safe scripts, FIFO waiting across
// processes, and waiters woken holding their permits. On a quorum it needs
// more than a majority (SemaphoreQuorum) and does not queue.
//
// PROTOCOL.md, beside this package's source, says how each guarantee is
// kept and what it does not cover; bench/README.md has the measured costs.
// The package does not log, and starts goroutines only for what a caller
// asked for (a wait, renewal, Done's timer).
package mutex
