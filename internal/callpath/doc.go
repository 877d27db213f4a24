// Command callpath measures which files of library code one call runs
// through on its way to Redis, for the common calls: Locker.Lock,
// Lock.Unlock, Semaphore.Acquire and funnel's Allow on a fresh key, on a
// returning key (one script), on a key another Limiter wrote last (two
// scripts, no lock) and through the key's lock (WithUniformCost). Each call is warmed up twice (loading the scripts is not
// counted), then the coverage counters are cleared, the call made once and
// the counters written. Run it from the repository root with
//
//	sh internal/callpath/run.sh
//
// which builds it with coverage, starts a redis-server of its own on a free
// loopback port, and prints each call's files: those with a statement that
// ran during the call.
package main
