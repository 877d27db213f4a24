package mutex_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// redisWork returns the commands a server ran since its last CONFIG
// RESETSTAT, scripts' inner commands but not the scripts themselves (a
// first run goes by body after EVALSHA's NOSCRIPT), and the time it spent
// in scripts (µs), from INFO commandstats.
func redisWork(t *testing.T, rc *redis.Client) (calls, scriptUsec int64) {
	t.Helper()
	info, err := rc.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`cmdstat_([a-z|]+):calls=(\d+),usec=(\d+)`)
	for _, m := range re.FindAllStringSubmatch(info, -1) {
		if m[1] == "info" || m[1] == "config|resetstat" {
			continue
		}
		n, _ := strconv.ParseInt(m[2], 10, 64)
		if strings.HasPrefix(m[1], "eval") { // by hash or, once, by body
			u, _ := strconv.ParseInt(m[3], 10, 64)
			scriptUsec += u
			continue
		}
		calls += n
	}
	return calls, scriptUsec
}

// TestSemaphoreFlatCost: with 10 or 1,000 waiters queued, a release that
// grants the head waiter, and a TryAcquire refused behind the queue, run
// the same number of Redis commands (INFO commandstats, on a server of the
// test's own). The time they took is logged, not asserted.
func TestSemaphoreFlatCost(t *testing.T) {
	srv := testutil.StartServer(t)
	rc := srv.Client(t)
	ctx := context.Background()
	const cycles = 100
	var perCycle []int64
	for _, waiters := range []int{10, 1000} {
		// A wait lease of 30 s (3 retry intervals): no waiter is passed over
		// while the 1,100 are queued one by one on a loaded machine.
		l := mustNew(t, srv.Client(t), mutex.WithPrefix(testutil.NewPrefix()), mutex.WithRetryInterval(10*time.Second))
		s := mustSem(t, l, fmt.Sprint("flat", waiters), 1)
		holder, err := s.TryAcquire(ctx, 1, mutex.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		toks := make([]string, waiters+cycles)
		for i := range toks {
			if toks[i], err = mutex.SemEnqueue(ctx, s, 1); err != nil {
				t.Fatal(err)
			}
		}
		if err := rc.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := holder.Release(ctx); err != nil { // grants toks[0]
			t.Fatal(err)
		}
		for i := range cycles {
			if _, err := s.TryAcquire(ctx, 1); err == nil {
				t.Fatal("TryAcquire jumped the queue")
			}
			if n, err := mutex.SemRelease(ctx, s, toks[i]); err != nil || n != 1 {
				t.Fatalf("release of the granted head %d: %d, %v", i, n, err)
			}
		}
		calls, usec := redisWork(t, rc)
		perCycle = append(perCycle, calls)
		t.Logf("%4d waiters: %d commands, %d µs in scripts for %d cycles (%.1f µs a cycle)", waiters, calls, usec, cycles, float64(usec)/cycles)
	}
	if perCycle[0] != perCycle[1] {
		t.Errorf("Redis commands for %d release+TryAcquire cycles: %d with 10 waiters, %d with 1,000: want the same", cycles, perCycle[0], perCycle[1])
	}
}

// TestSemaphoreScriptsBounded: no semaphore script reads a range of a
// sorted set without a bound (LIMIT, or one element from an end), so that
// no call's work grows with the number of waiters or holders.
func TestSemaphoreScriptsBounded(t *testing.T) {
	ranged := regexp.MustCompile(`(?m)\bcall\('(ZRANGE\w*|ZREVRANGE\w*|ZREMRANGE\w*|HGETALL|HKEYS|HVALS|SMEMBERS|KEYS|SCAN)'(.*)$`)
	seen := 0
	for _, f := range []string{"semaphore.lua", "semaphore_lib.lua", "semaphore_acquire.lua", "semaphore_release.lua", "semaphore_extend.lua"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ranged.FindAllStringSubmatch(string(src), -1) {
			seen++
			args := m[2]
			bounded := strings.Contains(args, "'LIMIT'") || strings.Contains(args, ", 0, 0") || strings.Contains(args, ", -1, -1")
			if !bounded {
				t.Errorf("%s: %s%s reads an unbounded range", f, m[1], args)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no range reads found: the pattern is stale")
	}
}
