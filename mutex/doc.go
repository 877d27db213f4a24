// Package mutex is a distributed mutex kept in Redis.
//
// A Locker hands out locks on names; a Lock is one held lock:
//
//	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
//	locker, err := mutex.New(client, mutex.WithTTL(10*time.Second)) // ErrInvalid for a bad option
//	if err != nil {
//		return err
//	}
//	lk, err := locker.Lock(ctx, "order:42") // waits while ctx allows
//	if err != nil {
//		return err
//	}
//	defer lk.Unlock(ctx)
//
// # Guarantees
//
// A lock is a Redis string with a lease: the holder's token, a mark when a
// waiter asked to hear of the release, and, once the holder re-entered, the
// list of its open handles; a free lock is taken with one SET NX PX and
// released with a GET and a DEL. Acquire, release, extend and TTL are one
// Lua script each, one round trip each, and compare the holder's
// token (128 random bits per acquisition) inside the script, so a release
// that runs twice, late, or after the lease passed never touches another
// holder's lock. A holder that neither unlocks nor extends loses the lock when
// its lease ends; Done and Context report that on the client's clock, with a
// margin for clock drift (1% of the lease plus 2 ms).
//
// Like every lease-based lock, mutual exclusion holds only while holders
// finish within their lease: a holder paused past it (GC, a stalled VM) may
// overlap the next one. For data in the same Redis, Fragment closes that gap:
// Lock.UnlockWith writes only if the lock is still held, in the same script
// that releases it. Data outside Redis needs fencing by the resource itself.
//
// # Deadlines and retries
//
// Every call that talks to Redis returns by its context's deadline. Give
// the Locker a client with ContextTimeoutEnabled, so go-redis itself bounds
// each command by it; a client without it works too, but each call then
// runs in a goroutine of its own that the caller leaves at the deadline
// (a hung server would otherwise hold it for the client's ReadTimeout, 5 s
// by default, for each retry), and that goroutine and its connection stay
// busy until go-redis gives up. That goroutine costs each such call a
// hand-off between goroutines, and often between threads: on a 2-core VM,
// ~30 µs a call, where a serial Lock+Unlock takes ~120. A lock that such a
// left-behind attempt takes is released as soon as its reply arrives.
// Unlock is detached from its context's cancellation (a lock is released
// even when the caller gave up) but keeps its deadline; with an ended
// context it gets 2 s of its own.
//
// go-redis runs a command again when its reply was lost (MaxRetries, 3 by
// default), and so may a caller after an error. Every lock script answers a
// second run as it answered the first: an acquire finds its own token and
// reports the lock held, a re-entry lists its handle once, and a release
// leaves a record for at least 10 s from which the very same call, run
// again, gets the first run's reply, and UnlockWith its fragment's result
// (numbers, strings and booleans are kept; for a table it returns
// ErrResultUnknown). ErrNotHeld always means that the call did not run.
// The record goes to the name's key <prefix>{<name>}:record, which the
// Locker's next release of the name overwrites once it has had this
// release's reply (so a busy name costs one key, not one per release), or
// else to <prefix>{<name>}:record:<token>, which nothing overwrites. After an
// Unlock whose outcome is unknown, the handle's next Unlock makes the same
// call again, never a local hand-over: the lock may be gone from Redis.
// A Locker takes free locks with a native SET NX PX only once one of its
// scripts has run, so a server that refuses scripts hands out no lock that
// could not be released.
//
// # Re-entry
//
// Go has no goroutine identity, so ownership is explicit: Lock.Context returns
// a context that carries the lock, and Lock or TryLock of the same name and
// Locker through it re-enters (a hold count in Redis) instead of waiting. The
// name is free again when every handle has been unlocked.
//
// # Contention
//
// Goroutines of one Locker that wait for a name queue in FIFO order; only the
// head polls Redis. An Unlock with a local waiter hands the lock over without
// releasing it: with no round trip at all while the lease still has 90% of
// the waiter's lease left, otherwise in the release script (a fresh token and
// lease), so under local contention an acquisition costs a fraction of a
// round trip (see Locker). Waiters in
// other processes hear of a release through Pub/Sub, subscribed only while
// they wait, and a release publishes only if a waiter marked the lock. Both
// are optimisations: the jittered retry ticker alone is enough.
//
// # Renewal and loss
//
// With AutoRenew a goroutine extends the lease every lease/3 until Unlock. A
// lock whose renewal finds it taken, or whose renewals fail until the lease
// must have ended, is lost: Done closes and Context is cancelled with cause
// ErrLockLost. The package never re-acquires a lost lock behind its holder.
//
// # Fencing
//
// WithFencing gives every acquisition a number greater than any earlier
// one for the name (Lock.Fence), for resources outside Redis that can refuse
// a stale holder. The counter expires when idle; see WithFencing for the
// exact guarantee.
//
// # Replicas
//
// Redis replicates asynchronously: a lock granted by a master that fails
// before its replica saw the write is granted again after the failover.
// WithReplicaAck closes most of that window: each write that grants or
// keeps a lock waits (WAIT, on the write's connection, in the same round
// trip where it can) until n replicas have it, and a grant they did not
// acknowledge is undone and fails with ErrNotReplicated.
//
// # Quorum
//
// NewQuorum keeps each lock on a majority of N independent masters (the
// Redlock algorithm): calls fan out in parallel, each node bounded by a node
// timeout, and a lock counts as held only while a majority has it within the
// lease minus the time acquiring took and a drift margin. It survives the
// loss of a minority of masters. Fencing and Fragments need the lock and its
// data in one Redis and are not offered there: WithFencing is not a
// QuorumOption, and a Fragment gets ErrUnsupported. A master
// restarted without persistence forgets its locks: use AOF with fsync always,
// or WithRejoinDelay to keep a restarted master out for longer than a lease.
//
// # Keys
//
// A lock on name lives at <prefix>{<name>}:lock, with '{', '}' and '~' in the
// name escaped, so all keys of one name hash to one Redis Cluster slot and a
// name can never choose another name's slot. Names are data: they travel as
// script keys, never as Lua source.
//
// The package does not log. It starts goroutines only while a Lock waits
// (the Pub/Sub reader), for AutoRenew, for the timer behind Done and
// Context, started when they are first called, for a call on a client
// without ContextTimeoutEnabled (see above), and to release a lock obtained
// for a caller whose context ended before it could be returned; none
// outlives its use.
package mutex
