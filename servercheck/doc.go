// Package servercheck tells whether a Redis server may delete funnelguard's
// keys to free memory, which would turn limits and locks off without a
// word: an evicted funnel key is an empty bucket, an evicted lock is free
// to the next caller while its holder still works.
//
//	findings, err := servercheck.Check(ctx, client)
//	if errors.Is(err, servercheck.ErrEvictionPolicy) {
//		return err // or log it: findings name each server and its settings
//	}
//
// A server with a memory limit (maxmemory) evicts keys as its
// maxmemory-policy says; every key funnelguard writes has a TTL, so
// volatile-* policies evict them as allkeys-* ones do. Safe are
// maxmemory-policy noeviction, or no limit (maxmemory 0, a 64-bit server's
// default). With noeviction a full server refuses writes (OOM): calls
// return errors (guard.ErrRejected), not wrong answers. An evicting policy
// without a limit is safe but gets a Note.
//
// Check asks every server a client writes to (every master of a cluster,
// every shard of a ring; not replicas, which apply their master's
// deletions), reading INFO memory, or CONFIG GET where INFO lacks the
// fields. It returns by its context's deadline even when a server hangs;
// on a client without ContextTimeoutEnabled the asking goroutine it leaves
// ends at go-redis's own timeouts.
package servercheck
