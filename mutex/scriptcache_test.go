package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// A script cache emptied under load (SCRIPT FLUSH, or a failover to a
// replica whose cache never held the scripts) costs each call at most one
// extra round trip per script, and never an error: every script goes out as
// EVALSHA, and a NOSCRIPT reply is answered with the body (EVAL).

// The load of the script cache tests: 64 goroutines, the script cache
// flushed every flushEvery calls completed in all.
const flushEvery = 8

// flushCalls is each worker's number of calls: 64 x 8 calls and a flush
// every 8 make 64 flushes (a few seconds under -race on two cores); -short
// keeps 32, more than the 20 the test needs.
func flushCalls() int {
	if testing.Short() {
		return 4
	}
	return 8
}

// scriptCacheSetups are the Lockers the load runs on: plain, and waiting for
// a replica (WithReplicaAck), whose scripts go out in a pipeline with WAIT.
var scriptCacheSetups = []struct {
	name       string
	replicated bool
}{{"plain", false}, {"replica-ack", true}}

// scriptCacheServer returns the address the setup's Lockers use, and their
// options.
func scriptCacheServer(t *testing.T, replicated bool) (string, []mutex.Option) {
	if !replicated {
		return testutil.StartServer(t).Addr, nil
	}
	r := testutil.StartReplicated(t, 1)
	// The master streams writes to a new replica only once the replica
	// acknowledged the sync, which it does within a second: wait for that
	// here, not in the first calls.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := r.Master.Client(t).Pipeline()
	p.Set(ctx, testutil.NewPrefix()+"sync", 1, time.Minute)
	acks := p.Do(ctx, "WAIT", 1, 5000)
	if _, err := p.Exec(ctx); err != nil || acks.Val() != int64(1) {
		t.Fatalf("WAIT for the new replica: %v, %v", acks.Val(), err)
	}
	// Below the clients' ReadTimeout (3 s); a loopback replica answers in
	// well under a millisecond when the machine is idle.
	return r.Master.Addr, []mutex.Option{mutex.WithReplicaAck(1, 2*time.Second)}
}

// TestScriptCacheLossUnderLoad runs 64 goroutines of Lock, TryLock,
// LockWith, TryLockWith, Extend, TTL, Run, Unlock and UnlockWith, on a hot
// name (hand-overs, waiting attempts) and on names of their own, while
// another goroutine empties the script cache again and again. No call may
// fail, and the hot name's counter, read and then written by UnlockWith
// under the lock, must count every critical section: two holders at once
// would lose an increment.
func TestScriptCacheLossUnderLoad(t *testing.T) {
	for _, setup := range scriptCacheSetups {
		t.Run(setup.name, func(t *testing.T) {
			addr, opts := scriptCacheServer(t, setup.replicated)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang, not a speed target
			defer cancel()
			stats := &testutil.ScriptStats{}
			prefix := testutil.NewPrefix()
			const lockers = 4
			ls := make([]*mutex.Locker, lockers)
			for i := range ls {
				// Half the clients bound commands by their context, half run
				// under the Locker's own deadline (ctxcall): both paths meet
				// the flushes.
				c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 32, ContextTimeoutEnabled: i%2 == 0})
				t.Cleanup(func() { c.Close() })
				c.AddHook(stats)
				ls[i] = mustNew(t, c, append([]mutex.Option{mutex.WithPrefix(prefix), mutex.WithRetryInterval(10 * time.Millisecond)}, opts...)...)
			}
			data := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 32})
			t.Cleanup(func() { data.Close() })
			hot := mustKey(t, ls[0], "hot", "n")

			var inside atomic.Int32
			var sections, tryWins atomic.Int64
			// commit ends a critical section on the hot name that read v:
			// it writes v+1 only while lk still holds the lock.
			commit := func(ctx context.Context, lk *mutex.Lock, v int64) error {
				inside.Add(-1) // before the release: the next holder may enter at once
				res, err := lk.UnlockWith(ctx, mutex.Call{Fragment: setFragment, Keys: []string{hot}, Args: []any{v + 1}})
				if err != nil {
					return fmt.Errorf("UnlockWith: %w", err)
				}
				if res != int64(1) {
					return fmt.Errorf("UnlockWith = %#v, want 1", res)
				}
				sections.Add(1)
				return nil
			}
			enter := func() {
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders of the hot lock at once", n)
				}
			}
			// section is a critical section that reads the counter over
			// another client.
			section := func(ctx context.Context, lk *mutex.Lock) error {
				enter()
				return commit(ctx, lk, getCounter(t, ctx, data, hot))
			}
			readHot := mutex.Call{Fragment: readFragment, Keys: []string{hot}}

			contended := func(ctx context.Context, l *mutex.Locker, i int) error {
				if i%2 == 0 {
					lk, err := l.Lock(ctx, "hot")
					if err != nil {
						return fmt.Errorf("Lock: %w", err)
					}
					return section(ctx, lk)
				}
				// The counter read in the acquire script, or under the lock
				// after a local hand-over (Run).
				lk, res, err := l.LockWith(ctx, "hot", readHot)
				if err != nil {
					return fmt.Errorf("LockWith: %w", err)
				}
				enter()
				arr, _ := res.([]any)
				var v int64
				if len(arr) > 0 && arr[0] != "" {
					s, _ := arr[0].(string)
					if v, err = strconv.ParseInt(s, 10, 64); err != nil {
						return fmt.Errorf("LockWith result %#v: %w", res, err)
					}
				}
				return commit(ctx, lk, v)
			}

			own := func(ctx context.Context, l *mutex.Locker, w, i int) error {
				name := "own" + strconv.Itoa(w)
				key := mustKey(t, l, name, "n")
				// Lock, Unlock: a native SET NX once a script has run (no
				// script with WithReplicaAck), then the unlock script.
				lk, err := l.Lock(ctx, name)
				if err != nil {
					return fmt.Errorf("Lock: %w", err)
				}
				if err := lk.Unlock(ctx); err != nil {
					return fmt.Errorf("Unlock: %w", err)
				}
				// TryLock, Extend, TTL, Run, UnlockWith.
				if lk, err = l.TryLock(ctx, name); err != nil {
					return fmt.Errorf("TryLock of a free lock: %w", err)
				}
				if err := lk.Extend(ctx, time.Minute); err != nil {
					return fmt.Errorf("Extend: %w", err)
				}
				if d, err := lk.TTL(ctx); err != nil || d <= 0 || d > time.Minute {
					return fmt.Errorf("TTL = %v, %w; want up to a minute", d, err)
				}
				res, err := lk.Run(ctx, mutex.Call{Fragment: readFragment, Keys: []string{key}, Args: []any{"run"}})
				if err != nil {
					return fmt.Errorf("Run: %w", err)
				}
				if want := strconv.Itoa(i - 1); i > 0 && !equal(res, []any{want, int64(1), int64(1), "run"}) {
					return fmt.Errorf("Run = %#v, want the value %s of the last UnlockWith", res, want)
				}
				if res, err := lk.UnlockWith(ctx, mutex.Call{Fragment: setFragment, Keys: []string{key}, Args: []any{i}}); err != nil || res != int64(1) {
					return fmt.Errorf("UnlockWith = %#v, %w", res, err)
				}
				// TryLockWith, Unlock.
				lk, res, err = l.TryLockWith(ctx, name, mutex.Call{Fragment: readFragment, Keys: []string{key}})
				if err != nil {
					return fmt.Errorf("TryLockWith: %w", err)
				}
				if !equal(res, []any{strconv.Itoa(i), int64(1), int64(0), ""}) {
					return fmt.Errorf("TryLockWith = %#v, want the value %d just written", res, i)
				}
				if err := lk.Unlock(ctx); err != nil {
					return fmt.Errorf("Unlock after TryLockWith: %w", err)
				}
				// TryLock of the hot name: mostly ErrLocked.
				lk, err = l.TryLock(ctx, "hot")
				switch {
				case errors.Is(err, mutex.ErrLocked):
					return nil
				case err != nil:
					return fmt.Errorf("TryLock of the hot name: %w", err)
				}
				tryWins.Add(1)
				return section(ctx, lk)
			}

			load := testutil.FlushLoad(t, ctx, []string{addr}, testutil.FlushWorkers, flushCalls(), flushEvery, func(ctx context.Context, w, i int) error {
				l := ls[w%lockers]
				if w%2 == 0 {
					return contended(ctx, l, i)
				}
				return own(ctx, l, w, i)
			})
			got := getCounter(t, ctx, data, hot)
			t.Logf("%d calls, %d SCRIPT FLUSH during them; %d critical sections on the hot name (%d by TryLock); %v",
				load.Calls, load.Flushes, sections.Load(), tryWins.Load(), stats)
			load.Check(t, testutil.MinFlushes)
			stats.Check(t, "the Lockers' clients", testutil.MinFlushes)
			if got != sections.Load() {
				t.Errorf("hot counter = %d after %d critical sections: %d increments lost (two holders at once)", got, sections.Load(), sections.Load()-got)
			}
		})
	}
}

// TestScriptCacheLossQuorum flushes the script cache of one of a quorum's
// three nodes under 64 goroutines of Lock, TryLock, Extend, TTL and Unlock.
// No call may fail, no node may answer an error (the quorum would hide a
// node's failure from the caller), and the hot lock has one holder at a
// time.
func TestScriptCacheLossQuorum(t *testing.T) {
	srvs := testutil.StartServers(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clients := make([]mutex.Client, len(srvs))
	stats := make([]*testutil.ScriptStats, len(srvs))
	for i, s := range srvs {
		c := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 32, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		stats[i] = &testutil.ScriptStats{}
		c.AddHook(stats[i])
		clients[i] = c
	}
	l := newQuorum(t, clients, mutex.WithRetryInterval(5*time.Millisecond))
	var inside atomic.Int32
	var sections atomic.Int64
	load := testutil.FlushLoad(t, ctx, []string{srvs[0].Addr}, testutil.FlushWorkers, flushCalls(), flushEvery, func(ctx context.Context, w, i int) error {
		if w%2 == 0 {
			lk, err := l.Lock(ctx, "hot")
			if err != nil {
				return fmt.Errorf("Lock: %w", err)
			}
			if n := inside.Add(1); n != 1 {
				t.Errorf("%d holders of the hot lock at once", n)
			}
			inside.Add(-1)
			sections.Add(1)
			if err := lk.Unlock(ctx); err != nil {
				return fmt.Errorf("Unlock: %w", err)
			}
			return nil
		}
		lk, err := l.TryLock(ctx, "own"+strconv.Itoa(w))
		if err != nil {
			return fmt.Errorf("TryLock of a free lock: %w", err)
		}
		if err := lk.Extend(ctx, time.Minute); err != nil {
			return fmt.Errorf("Extend: %w", err)
		}
		if d, err := lk.TTL(ctx); err != nil || d <= 0 || d > time.Minute {
			return fmt.Errorf("TTL = %v, %w; want up to a minute", d, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			return fmt.Errorf("Unlock: %w", err)
		}
		return nil
	})
	t.Logf("%d calls, %d SCRIPT FLUSH of node 0 during them, %d critical sections; node 0: %v; node 1: %v; node 2: %v",
		load.Calls, load.Flushes, sections.Load(), stats[0], stats[1], stats[2])
	load.Check(t, testutil.MinFlushes)
	stats[0].Check(t, "node 0 (flushed)", testutil.MinFlushes)
	stats[1].Check(t, "node 1", 0)
	stats[2].Check(t, "node 2", 0)
}

// TestScriptCacheLossCost runs each call serially right after a SCRIPT
// FLUSH and again: right after, each script it runs costs one extra round
// trip (EVALSHA answered NOSCRIPT, or its pipeline with WAIT, then the same
// with EVAL), and nothing else changes; made again, it costs nothing extra.
func TestScriptCacheLossCost(t *testing.T) {
	for _, setup := range scriptCacheSetups {
		t.Run(setup.name, func(t *testing.T) {
			addr, opts := scriptCacheServer(t, setup.replicated)
			prefix := testutil.NewPrefix()
			c := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { c.Close() })
			rec := testutil.Record(c)
			l := mustNew(t, c, append([]mutex.Option{mutex.WithPrefix(prefix)}, opts...)...)
			flush := func(ctx context.Context) error { return testutil.ScriptFlush(ctx, addr) }
			read := func(name string) mutex.Call {
				return mutex.Call{Fragment: readFragment, Keys: []string{mustKey(t, l, name, "n")}, Args: []any{"x"}}
			}
			write := func(name string) mutex.Call {
				return mutex.Call{Fragment: setFragment, Keys: []string{mustKey(t, l, name, "n")}, Args: []any{"v"}}
			}
			for _, tc := range []struct {
				name string
				op   func(ctx context.Context, name string) error
			}{
				{"Lock, Unlock", func(ctx context.Context, name string) error {
					lk, err := l.Lock(ctx, name)
					if err != nil {
						return err
					}
					return lk.Unlock(ctx)
				}},
				{"TryLock, Extend, TTL, Run, UnlockWith", func(ctx context.Context, name string) error {
					lk, err := l.TryLock(ctx, name)
					if err != nil {
						return err
					}
					if err := lk.Extend(ctx, time.Minute); err != nil {
						return err
					}
					if _, err := lk.TTL(ctx); err != nil {
						return err
					}
					if _, err := lk.Run(ctx, read(name)); err != nil {
						return err
					}
					_, err = lk.UnlockWith(ctx, write(name))
					return err
				}},
				{"LockWith, UnlockWith", func(ctx context.Context, name string) error {
					lk, _, err := l.LockWith(ctx, name, read(name))
					if err != nil {
						return err
					}
					_, err = lk.UnlockWith(ctx, write(name))
					return err
				}},
				{"TryLockWith and TryLock of a held lock", func(ctx context.Context, name string) error {
					held, err := l.Lock(ctx, name) // the same Locker: another client's call would load the scripts
					if err != nil {
						return err
					}
					defer held.Unlock(ctx)
					if _, _, err := l.TryLockWith(ctx, name, read(name)); !errors.Is(err, mutex.ErrLocked) {
						return fmt.Errorf("TryLockWith of a held lock: %w, want ErrLocked", err)
					}
					if _, err := l.TryLock(ctx, name); !errors.Is(err, mutex.ErrLocked) {
						return fmt.Errorf("TryLock of a held lock: %w, want ErrLocked", err)
					}
					return nil
				}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					cost := testutil.FlushCostOf(t, flush, func(ctx context.Context, run int) error {
						return tc.op(ctx, fmt.Sprintf("%s/%d", tc.name, run))
					}, rec)
					t.Logf("right after SCRIPT FLUSH: %v; made again: none", cost)
				})
			}
		})
	}
}

// TestScriptCacheLossCostQuorum is TestScriptCacheLossCost on a quorum whose
// first node lost its scripts: that node's part costs one extra round trip
// per script, the other nodes' nothing.
func TestScriptCacheLossCostQuorum(t *testing.T) {
	srvs := testutil.StartServers(t, 3)
	clients := make([]mutex.Client, len(srvs))
	recs := make([]*testutil.CommandRecorder, len(srvs))
	for i, s := range srvs {
		c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		recs[i] = testutil.Record(c)
		clients[i] = c
	}
	l := newQuorum(t, clients)
	flush := func(ctx context.Context) error { return testutil.ScriptFlush(ctx, srvs[0].Addr) }
	cost := testutil.FlushCostOf(t, flush, func(ctx context.Context, run int) error {
		name := "q" + strconv.Itoa(run)
		lk, err := l.Lock(ctx, name)
		if err != nil {
			return err
		}
		if err := lk.Extend(ctx, time.Minute); err != nil {
			return err
		}
		if _, err := lk.TTL(ctx); err != nil {
			return err
		}
		return lk.Unlock(ctx)
	}, recs[0], recs[1], recs[2])
	t.Logf("node 0 right after SCRIPT FLUSH: %v; made again, and on the other nodes: none", cost)
}
