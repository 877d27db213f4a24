package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// The Redis commands of one funnelguard admission on a fresh key, in two
// minimal scripts with no library around them: read the state and the
// server's TIME and take the lock; then check the lock, release it, write
// the state and its TTL. No design with two round trips, Redis as the clock
// and the lock in its own key does less; its ×PING is the floor that the
// admission target is measured against.
var (
	floorRead = redis.NewScript(`
local t = redis.call('TIME')
local v = redis.call('HMGET', KEYS[2], ARGV[3])
return {redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0, t[1], v[1]}`)
	floorWrite = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[4]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return 1`)
)

// floorFresh is the least a one-round-trip admission of a fresh key can
// ask of Redis in this design (admit.lua's new-key path with no library and
// no parsing): check that neither the state nor the key's lock exists, read
// TIME, write the state and its TTL. Its server µs/op is the reference for
// the "Redis time per admission" target on whatever machine runs the bench.
var floorFresh = redis.NewScript(`
if redis.call('EXISTS', KEYS[1], KEYS[2]) ~= 0 then
  return 0
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. t[1] .. t[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`)

// libFreshFloor names floorFresh in the "Allow admitted parallel, 1 rule"
// and "serial, 1 rule" cases, where it alternates with the libraries like
// one of them.
const libFreshFloor = "one script"

// floorFreshAdmitted runs floorFresh on fresh keys.
func floorFreshAdmitted(parallel bool) func(context.Context, *env) (workload, error) {
	return func(ctx context.Context, e *env) (workload, error) {
		c := e.client()
		if err := floorFresh.Load(ctx, c).Err(); err != nil {
			return workload{}, err
		}
		return workload{goroutines: width(e, parallel), op: func(ctx context.Context, g, i int) error {
			tag := "{" + admittedKey(g, i) + "}"
			n, err := floorFresh.Run(ctx, c, []string{e.prefix + tag + ":f", e.prefix + tag + ":lock"}, "r", "0:1000000:", 3600000).Int()
			if err == nil && n != 1 {
				err = fmt.Errorf("one script: fresh key %s not new", tag)
			}
			return err
		}}, nil
	}
}

// libFloor names the floor in the "Allow admitted serial, 1 rule" case,
// where it alternates with the libraries like one of them.
const libFloor = "bare scripts"

// floorAdmitted is the admission floor: Allow's commands on fresh keys.
func floorAdmitted(ctx context.Context, e *env) (workload, error) {
	c := e.client()
	for _, s := range []*redis.Script{floorRead, floorWrite} {
		if err := s.Load(ctx, c).Err(); err != nil {
			return workload{}, err
		}
	}
	return workload{goroutines: 1, op: func(ctx context.Context, _, i int) error {
		tag := "{floor" + strconv.Itoa(i) + "}"
		keys := []string{e.prefix + tag + ":lock", e.prefix + tag + ":f"}
		token := newToken() + "-"
		r, err := floorRead.Run(ctx, c, keys, token, 1000, "r").Slice()
		if err != nil {
			return err
		}
		if r[0] != int64(1) {
			return fmt.Errorf("floor: fresh lock taken: %v", r)
		}
		return floorWrite.Run(ctx, c, keys, token, "r", "0:1000000:"+fmt.Sprint(r[1]), 60000).Err()
	}}, nil
}
