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
// A lock has one owner at a time, checked by a random token inside every
// script; every call returns by its context's deadline; a call that go-redis
// runs again after a lost reply gets the first run's answer; every key has a
// TTL, and a lock whose lease ended is lost (Done, Context), never taken
// again behind its holder.
//
// Options add re-entry through Lock.Context, WithAutoRenew, fencing, replica
// acknowledgement and Redlock (NewQuorum); a Fragment runs the caller's Lua
// atomically with an acquire or a release. Locker.Semaphore is a counting
// semaphore in the shape of golang.org/x/sync/semaphore.
//
// PROTOCOL.md, beside this package's source, says how each guarantee is
// kept and what it does not cover.
package mutex
