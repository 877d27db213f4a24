package main

import (
	"context"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// A memRow is one line of the memory table: a value per library.
type memRow struct {
	name   string
	unit   string
	values map[string]int64
}

// releaseRecord is how long funnelguard keeps the record of a lock's
// release (mutex's recordTTL).
const releaseRecord = 10 * time.Second

// leftoverCalls is how many keys the TTL check uses per library.
const leftoverCalls = 200

// Short rules for the TTL check, so their keys expire within a second.
var (
	shortRules  = []funnel.Rule{funnel.AtMost(1, 100*time.Millisecond), funnel.AtMost(2, 200*time.Millisecond), funnel.AtMost(3, 300*time.Millisecond)}
	shortWindow = 300 * time.Millisecond
)

// measureMemory reports MEMORY USAGE of the state of one active key (after
// one admitted call) with 1 and 3 rules, for funnelguard and redis_rate
// (summed over its key per rule); then admits and floods leftoverCalls keys
// with short rules, waits for every TTL, and counts the keys left with SCAN.
func measureMemory(ctx context.Context, addr string) ([]memRow, error) {
	e := &env{addr: addr, prefix: fmt.Sprintf("fgbench:mem-%d:", time.Now().UnixNano()), goroutines: 1}
	defer e.close(context.WithoutCancel(ctx))
	c := e.client()
	lim, err := funnel.New(c, funnel.WithPrefix(e.prefix))
	if err != nil {
		return nil, err
	}
	locker, err := mutex.New(c, mutex.WithPrefix(e.prefix))
	if err != nil {
		return nil, err
	}
	keyOf := locker.Key // the funnel's state key: kind "f"
	rl := redis_rate.NewLimiter(c)

	var rows []memRow
	for _, rs := range []struct {
		name  string
		rules []funnel.Rule
	}{{"1 rule", oneRule}, {"3 rules", threeRules}} {
		key := "active-" + fmt.Sprint(len(rs.rules))
		if _, err := lim.Allow(ctx, key, rs.rules...); err != nil {
			return nil, err
		}
		stateKey, err := keyOf(key, "f")
		if err != nil {
			return nil, err
		}
		fg, err := c.MemoryUsage(ctx, stateKey, 0).Result()
		if err != nil {
			return nil, fmt.Errorf("MEMORY USAGE of the funnel key: %w", err)
		}
		limits := rateLimits(rs.rules)
		if _, err := rateAllow(ctx, rl, limits, e.prefix+key); err != nil {
			return nil, err
		}
		var rr int64
		for i := range limits {
			k := "rate:" + e.prefix + key
			if len(limits) > 1 {
				k += ":" + fmt.Sprint(i)
			}
			n, err := c.MemoryUsage(ctx, k, 0).Result()
			if err != nil {
				return nil, fmt.Errorf("MEMORY USAGE of %s: %w", k, err)
			}
			rr += n
		}
		rows = append(rows, memRow{name: "state of an active key, " + rs.name, unit: "bytes",
			values: map[string]int64{libFunnel: fg, libRedisRate: rr}})
	}

	// Keys left after every TTL: each key admitted once, then denied once.
	limits := rateLimits(shortRules)
	for i := range leftoverCalls {
		key := "short-" + fmt.Sprint(i)
		for range 2 {
			if _, err := lim.Allow(ctx, key, shortRules...); err != nil {
				return nil, err
			}
			if _, err := rateAllow(ctx, rl, limits, e.prefix+key); err != nil {
				return nil, err
			}
		}
	}
	fgBefore, rrBefore := countKeys(ctx, c, e.prefix+"{short-*"), countKeys(ctx, c, "rate:"+e.prefix+"short-*")
	// redis_rate rounds its TTL up to whole seconds; a lock release leaves
	// a record for releaseRecord (so a retried release reports what the
	// first did).
	time.Sleep(max(time.Second+shortWindow, releaseRecord+100*time.Millisecond))
	rows = append(rows,
		memRow{name: fmt.Sprintf("keys of %d short-rule keys, before TTLs", leftoverCalls), unit: "keys",
			values: map[string]int64{libFunnel: fgBefore, libRedisRate: rrBefore}},
		memRow{name: "keys left after TTLs", unit: "keys",
			values: map[string]int64{libFunnel: countKeys(ctx, c, e.prefix+"{short-*"), libRedisRate: countKeys(ctx, c, "rate:"+e.prefix+"short-*")}})
	return rows, nil
}

// countKeys counts the keys matching pattern.
func countKeys(ctx context.Context, c *redis.Client, pattern string) int64 {
	var n int64
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	return n
}
