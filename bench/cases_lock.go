package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/bsm/redislock"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// lockTTL is the lease every library gets where it takes one (funnelguard's
// default; redsync keeps its own default expiry of 8 s).
const lockTTL = mutex.DefaultTTL

// Library names, the columns of the report.
const (
	libFunnelguard = "funnelguard"
	libRedislock   = "redislock"
	libRedsync     = "redsync"
	libMinimal     = "SET NX + Lua"
)

// minimalRelease is the classic compare-and-delete release.
var minimalRelease = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0`)

// uncontendedCases time Lock+Unlock on names no one else takes: one name
// per goroutine.
func uncontendedCases() []benchCase {
	var out []benchCase
	for _, parallel := range []bool{false, true} {
		mode := "serial"
		if parallel {
			mode = "parallel"
		}
		subjects := []subject{
			{libFunnelguard, uncontended(parallel, funnelguardLock)},
			{libRedislock, uncontended(parallel, redislockLock)},
			{libRedsync, uncontended(parallel, redsyncLock)},
			{libMinimal, uncontended(parallel, minimalLock)},
		}
		if !parallel {
			subjects = append(subjects, subject{libRawCommands, uncontended(false, rawFunnelguardLock)},
				subject{handedOffName(libRedislock), handedOff(uncontended(false, redislockLock))})
		}
		out = append(out, benchCase{name: "Lock+Unlock uncontended " + mode, parallel: parallel, turns: true, subjects: subjects})
	}
	return out
}

// defaultClientCases time the serial cycle on a client made with go-redis's
// defaults, without ContextTimeoutEnabled: funnelguard then runs each call
// whose context can end in a goroutine of its own, so that it returns by the
// deadline all the same (mutex's doc, "Deadlines and retries"); redislock
// leaves such a call to go-redis's ReadTimeout. The case shows what that
// hand-off costs: "funnelguard, no deadline" is the same cycle with a
// context that cannot end (context.WithoutCancel), which runs in the
// caller's goroutine.
func defaultClientCases() []benchCase {
	on := func(mk lockMaker) func(context.Context, *env) (workload, error) {
		return func(_ context.Context, e *env) (workload, error) {
			cycle := mk(e.defaultClient())(e.prefix + "u0")
			return workload{goroutines: 1, op: func(ctx context.Context, _, _ int) error { return cycle(ctx) }}, nil
		}
	}
	noDeadline := func(mk lockMaker) func(context.Context, *env) (workload, error) {
		return func(_ context.Context, e *env) (workload, error) {
			cycle := mk(e.defaultClient())(e.prefix + "u0")
			return workload{goroutines: 1, op: func(ctx context.Context, _, _ int) error { return cycle(context.WithoutCancel(ctx)) }}, nil
		}
	}
	return []benchCase{{
		name:  "Lock+Unlock uncontended serial, go-redis default client",
		ref:   libRedislock,
		turns: true,
		subjects: []subject{
			{libFunnelguard, on(funnelguardLock)},
			{libRedislock, on(redislockLock)},
			{libNoDeadline, noDeadline(funnelguardLock)},
		},
	}}
}

// libNoDeadline is funnelguard called with a context that cannot end (no
// hand-off), beside the same cycle under the round's context.
const libNoDeadline = "funnelguard, no deadline"

// libUnacked is funnelguard without WithReplicaAck, in the replicated case.
const libUnacked = "funnelguard, no WAIT"

// replicaCases time Lock+Unlock on a master with one replica, with and
// without waiting for the replica to acknowledge each acquisition (WAIT in
// the acquisition's round trip): what WithReplicaAck costs.
func replicaCases() []benchCase {
	acked := func(c *redis.Client) func(string) func(context.Context) error {
		return funnelguardWith(c, mutex.WithReplicaAck(1, time.Second))
	}
	return []benchCase{{
		name:       "Lock+Unlock uncontended serial, 1 replica acknowledged",
		replicated: true,
		turns:      true,
		subjects: []subject{
			{libFunnelguard, uncontended(false, acked)},
			{libUnacked, uncontended(false, funnelguardLock)},
			{libRedislock, uncontended(false, redislockLock)},
		},
	}}
}

// A lockMaker builds a library's object on client c (a Locker, a redislock
// Client, a Redsync: one per client, shared by its goroutines, as each
// library's documentation has it), and from it one goroutine's Lock+Unlock
// cycle on a name.
type lockMaker func(c *redis.Client) func(name string) func(ctx context.Context) error

// uncontended runs one client, one name per goroutine.
func uncontended(parallel bool, mk lockMaker) func(context.Context, *env) (workload, error) {
	return func(_ context.Context, e *env) (workload, error) {
		lib := mk(e.client())
		n := width(e, parallel)
		cycles := make([]func(context.Context) error, n)
		for g := range cycles {
			cycles[g] = lib(e.prefix + "u" + strconv.Itoa(g))
		}
		return workload{goroutines: n, op: func(ctx context.Context, g, _ int) error { return cycles[g](ctx) }}, nil
	}
}

// funnelguardLock is mutex.Locker.Lock + Lock.Unlock with default settings.
// The goroutines share the Locker, so the commands of overlapping calls go
// together in pipelines (mutex/send.go).
func funnelguardLock(c *redis.Client) func(string) func(context.Context) error {
	return funnelguardWith(c)
}

// funnelguardWith is funnelguardLock with a Locker made with opts.
func funnelguardWith(c *redis.Client, opts ...mutex.Option) func(string) func(context.Context) error {
	l, err := mutex.New(c, opts...)
	return func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			if err != nil { // a bad option: every call says so
				return err
			}
			lk, err := l.Lock(ctx, name)
			if err != nil {
				return err
			}
			return lk.Unlock(context.WithoutCancel(ctx)) // as redislock and redsync: no deadline on a release
		}
	}
}

// redislockLock is redislock Obtain (no retry: its default) + Release.
func redislockLock(c *redis.Client) func(string) func(context.Context) error {
	rl := redislock.New(c)
	return func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			lk, err := rl.Obtain(ctx, name, lockTTL, nil)
			if err != nil {
				return err
			}
			return lk.Release(context.WithoutCancel(ctx))
		}
	}
}

// redsyncLock is redsync with one go-redis v9 pool, NewMutex(name) once per
// goroutine, then LockContext + UnlockContext.
func redsyncLock(c *redis.Client) func(string) func(context.Context) error {
	rs := redsync.New(goredis.NewPool(c))
	return func(name string) func(context.Context) error {
		m := rs.NewMutex(name)
		return func(ctx context.Context) error {
			if err := m.LockContext(ctx); err != nil {
				return err
			}
			_, err := m.UnlockContext(context.WithoutCancel(ctx))
			return err
		}
	}
}

// minimalLock is SET name token NX PX ttl, then the compare-and-delete
// script: the least a correct single-server lock can do.
func minimalLock(c *redis.Client) func(string) func(context.Context) error {
	ttl := lockTTL
	return func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			tok := newToken()
			ok, err := c.SetNX(ctx, name, tok, ttl).Result()
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%s is held", name)
			}
			return minimalRelease.Run(context.WithoutCancel(ctx), c, []string{name}, tok).Err()
		}
	}
}

// contendedCases time acquisitions of one name: G goroutines on one client
// (one Locker), and 4 clients with G/4 goroutines each; with each library's
// documented default retry, and with a 1 ms retry delay.
func contendedCases(goroutines int) []benchCase {
	var out []benchCase
	for _, fast := range []bool{false, true} {
		retry := "default retry"
		if fast {
			retry = "1 ms retry"
		}
		for _, clients := range []int{1, 4} {
			name := fmt.Sprintf("Lock contended %dx%d, %s", clients, goroutines/clients, retry)
			out = append(out, benchCase{
				name:     name,
				parallel: true,
				subjects: []subject{
					{libFunnelguard, contended(clients, fast, funnelguardContender)},
					{libRedislock, contended(clients, fast, redislockContender)},
					{libRedsync, contended(clients, fast, redsyncContender)},
				},
			})
		}
	}
	return out
}

// contended spreads the -goroutines goroutines over clients clients, all on
// one name; each goroutine gets its own cycle from mk, sharing the library
// object of its client (a Locker, a redislock Client, a Redsync).
func contended(clients int, fast bool, mk func(c *redis.Client, fast bool) func(name string) func(context.Context) error) func(context.Context, *env) (workload, error) {
	return func(_ context.Context, e *env) (workload, error) {
		per := e.goroutines / clients
		if per < 1 {
			return workload{}, errors.New("fewer goroutines than clients")
		}
		name := e.prefix + "hot"
		var cycles []func(context.Context) error
		for range clients {
			lib := mk(e.client(), fast)
			for range per {
				cycles = append(cycles, lib(name))
			}
		}
		return workload{goroutines: len(cycles), op: func(ctx context.Context, g, _ int) error { return cycles[g](ctx) }}, nil
	}
}

// funnelguardContender: one Locker per client; default retry interval
// (50 ms, cut short by release notifications and local hand-over) or 1 ms.
func funnelguardContender(c *redis.Client, fast bool) func(string) func(context.Context) error {
	var opts []mutex.Option
	if fast {
		opts = append(opts, mutex.WithRetryInterval(time.Millisecond))
	}
	l, err := mutex.New(c, opts...)
	return func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			if err != nil { // a bad option: every call says so
				return err
			}
			lk, err := l.Lock(ctx, name)
			if errors.Is(err, mutex.ErrNotObtained) {
				return errGaveUp
			}
			if err != nil {
				return err
			}
			return lk.Unlock(context.WithoutCancel(ctx))
		}
	}
}

// redislockContender: Obtain has no retry by default, so this is the
// documented pattern (example_test.go, ExampleClient_Obtain_retry): a
// LinearBackoff of 100 ms, or 1 ms, bounded by the round's context deadline.
func redislockContender(c *redis.Client, fast bool) func(string) func(context.Context) error {
	backoff := 100 * time.Millisecond
	if fast {
		backoff = time.Millisecond
	}
	rl := redislock.New(c)
	opt := &redislock.Options{RetryStrategy: redislock.LinearBackoff(backoff)}
	return func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			lk, err := rl.Obtain(ctx, name, lockTTL, opt)
			if errors.Is(err, redislock.ErrNotObtained) {
				return errGaveUp
			}
			if err != nil {
				return err
			}
			return lk.Release(context.WithoutCancel(ctx))
		}
	}
}

// redsyncContender: one Redsync over one pool per client; its defaults (32
// tries, 50-250 ms random delay), or WithRetryDelay(1 ms) with tries bounded
// only by the round's context.
func redsyncContender(c *redis.Client, fast bool) func(string) func(context.Context) error {
	rs := redsync.New(goredis.NewPool(c))
	var opts []redsync.Option
	if fast {
		opts = append(opts, redsync.WithRetryDelay(time.Millisecond), redsync.WithTries(1<<30))
	}
	return func(name string) func(context.Context) error {
		m := rs.NewMutex(name, opts...)
		return func(ctx context.Context) error {
			if err := m.LockContext(ctx); err != nil {
				var taken *redsync.ErrTaken
				if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) {
					return errGaveUp
				}
				return err
			}
			_, err := m.UnlockContext(context.WithoutCancel(ctx))
			return err
		}
	}
}
