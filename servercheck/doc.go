// Package servercheck tells whether a Redis server may delete funnelguard's
// keys to free memory, which would turn limits and locks off without a
// word.
//
//	findings, err := servercheck.Check(ctx, client)
//	if errors.Is(err, servercheck.ErrEvictionPolicy) {
//		return err // or log it: findings name each server and its settings
//	}
//
// # What is checked
//
// A Redis with a memory limit (maxmemory) deletes keys when it is full, as
// its maxmemory-policy says. allkeys-* policies pick among all keys,
// volatile-* ones among keys with a TTL; every key funnelguard writes (a
// funnel's state, a lock, a release record) has a TTL, so both kinds evict
// them. An evicted funnel key is an empty bucket: the next call is admitted
// as if the key had never been seen, and a number that had used up its
// codes for the day gets more. An evicted lock is free to the next caller
// while its holder still works.
//
// Check asks every server a client writes to (one for a *redis.Client,
// failover clients included; every master of a *redis.ClusterClient; every
// shard of a *redis.Ring) for maxmemory and maxmemory-policy, and returns one
// Finding per server. It reads INFO memory, which works where CONFIG is
// renamed or disabled, and falls back to CONFIG GET when INFO lacks the
// fields (Redis before 4.0) or is refused. Replicas are not asked: they do
// not evict on their own, they apply their master's deletions.
//
// # Safe settings
//
// Either of these keeps funnelguard's keys until they expire:
//
//   - maxmemory-policy noeviction (with any maxmemory), or
//   - no memory limit: maxmemory 0, the default of a 64-bit server (a 32-bit
//     server sets itself a 3 GB limit with noeviction).
//
// Give funnelguard a Redis, or a database on a Redis, that does not double as
// an evicting cache: the policy is per server.
//
// With noeviction, a full server refuses writes with an OOM error instead of
// making room. funnelguard's calls then return errors rather than wrong
// answers: a funnel call that would admit, or a Lock, gets the OOM error (a
// guard answers 503, guard.ErrRejected, whatever its failure policy), while
// a call the stored state already denies is still denied. Monitor memory
// (INFO memory used_memory against maxmemory) so that this stays rare.
//
// An evicting policy on a server without a memory limit evicts nothing, so
// Check counts it safe (its Err is nil), but the Finding's Note says that it
// would start evicting as soon as a limit is set. It is a note, not an
// error, so that a start-up check that refuses to run on errors does not
// refuse a server that cannot evict.
//
// # Deadlines
//
// Check returns by its context's deadline, even when a server hangs. Give
// it a client with ContextTimeoutEnabled, so that go-redis itself bounds
// each command; on another client the asking runs in a goroutine that Check
// leaves at the deadline, and that goroutine ends when go-redis gives up on
// its own timeouts (ReadTimeout).
package servercheck
