package funnel_test

import (
	"context"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// Two Limiters take turns on one key, so its values are written by every
// path: the fresh key's gate, the lock path (a Limiter that did not write
// last reads a state it has not seen) and the returning key's gate, which
// leaves the TTL alone while the new values stay before the grid point the
// old ones gave the key. After every admission the key must live until its
// state is empty (a key that expired early would forget units: a limit
// broken), and not past the next grid point. 400 units of 1 a second cross
// the grid (2^18 ms) once; the clock moves 0 to 600 ms between calls.
func TestExpiryCoversTheStateOnEveryPath(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c, lims := twoLimiters(t, b)
		rule := funnel.Rule{Name: "second", Capacity: 1000, Leak: 1, Per: time.Second}
		grid := funnel.Grid(rule)
		key := b.Prefix + "{k}:f"
		clock := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
		rng := rand.New(rand.NewPCG(7, 8))
		var first, last time.Duration
		who := 0
		for i := range 400 {
			if rng.IntN(4) == 0 {
				who = 1 - who // the other Limiter: the lock path
			}
			if b.Mini != nil {
				clock = clock.Add(time.Duration(rng.IntN(600)) * time.Millisecond)
				b.Mini.SetTime(clock)
			}
			start := time.Now()
			res, err := lims[who].Allow(ctx, "k", rule)
			if err != nil || !res.Allowed {
				t.Fatalf("call %d: Allow = %+v, %v", i, res, err)
			}
			d := c.PTTL(ctx, key).Val()
			if d < res.ResetAfter-time.Since(start)-time.Millisecond || d > res.ResetAfter+grid+time.Millisecond {
				t.Fatalf("call %d (Limiter %d): PTTL %v with the state empty in %v; want up to the next grid point (%v)", i, who, d, res.ResetAfter, grid)
			}
			if b.Mini != nil && d < res.ResetAfter {
				t.Fatalf("call %d: the key expires %v before its state is empty", i, res.ResetAfter-d)
			}
			if last = d; i == 0 {
				first = d
			}
		}
		if last < first+grid/2 {
			t.Fatalf("PTTL %v after 400 units, %v after the first: never grew past a grid point", last, first)
		}
	})
}

// A returning key, decided by returning.lua, runs at most 4 commands in
// Redis a decision (EXISTS of the lock, TIME, HMGET, HSET), and a PEXPIRE
// only when its values pass the key's grid point: counted in INFO
// commandstats of a server of this test's own, over 2,000 admissions of the
// bench's returning rule on 64 keys.
func TestReturningServerCommands(t *testing.T) {
	srv := testutil.StartServer(t)
	c := srv.Client(t)
	ctx := context.Background()
	lim := mustLimiter(t, c)
	rule := funnel.Rule{Name: "returning", Capacity: 100_000, Leak: 1000, Per: time.Hour}
	const keys, rounds = 64, 32
	for i := range 2 * keys { // fresh keys (admit.lua), then returning.lua loaded
		if res, err := lim.Allow(ctx, strconv.Itoa(i%keys), rule); err != nil || !res.Allowed {
			t.Fatalf("Allow = %+v, %v", res, err)
		}
	}
	before := scriptCommands(t, c)
	for range rounds {
		for k := range keys {
			if res, err := lim.Allow(ctx, strconv.Itoa(k), rule); err != nil || !res.Allowed {
				t.Fatalf("Allow = %+v, %v", res, err)
			}
		}
	}
	after := scriptCommands(t, c)
	if got := after.evals - before.evals; got != keys*rounds {
		t.Fatalf("%d scripts for %d returning admissions, want one each", got, keys*rounds)
	}
	perCall := float64(after.inner-before.inner) / float64(keys*rounds)
	t.Logf("%.3f commands in Redis a returning decision", perCall)
	if perCall > 4 {
		t.Fatalf("%.3f commands in Redis a returning decision, want at most 4", perCall)
	}
}

// serverCounts are commandstats' calls: scripts (EVAL, EVALSHA) and the
// commands but those and a connection's (the scripts' own, here).
type serverCounts struct{ evals, inner int64 }

var cmdStat = regexp.MustCompile(`cmdstat_([a-z|]+):calls=(\d+)`)

func scriptCommands(t *testing.T, c *redis.Client) serverCounts {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var s serverCounts
	for _, m := range cmdStat.FindAllStringSubmatch(info, -1) {
		n, _ := strconv.ParseInt(m[2], 10, 64)
		switch m[1] {
		case "eval", "evalsha":
			s.evals += n
		case "info", "hello", "ping":
		default:
			if !strings.Contains(m[1], "|") { // not CLIENT SETINFO, SCRIPT LOAD
				s.inner += n
			}
		}
	}
	return s
}

// The same for a Window: after every admission, by either Limiter (the
// fresh key's gate, the lock path), the key lives until its last unit
// leaves the window, and no longer (a window's expiry is not rounded). A
// lock path that wrote a third of the TTL passed every other test.
func TestExpiryCoversTheWindowOnEveryPath(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c, lims := twoLimiters(t, b)
		rule := funnel.Window(1000, 10*time.Second)
		key := b.Prefix + "{w}:f"
		clock := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
		rng := rand.New(rand.NewPCG(9, 10))
		who := 0
		for i := range 60 {
			if rng.IntN(3) == 0 {
				who = 1 - who
			}
			step := time.Duration(rng.IntN(600)) * time.Millisecond
			if b.Mini != nil {
				clock = clock.Add(step)
				b.Mini.SetTime(clock)
			} else {
				time.Sleep(step / 20)
			}
			start := time.Now()
			res, err := lims[who].Allow(ctx, "w", rule)
			if err != nil || !res.Allowed {
				t.Fatalf("call %d: Allow = %+v, %v", i, res, err)
			}
			d := c.PTTL(ctx, key).Val()
			if d < res.ResetAfter-time.Since(start)-time.Millisecond || d > res.ResetAfter+5*time.Millisecond { // 5 ms: see TestWindowRealServer
				t.Fatalf("call %d (Limiter %d): PTTL %v with the window empty in %v", i, who, d, res.ResetAfter)
			}
		}
	})
}

// twoLimiters returns a client of b and two Limiters on it under b's
// prefix, which take turns on one key (a Limiter that did not write last
// takes the lock path).
func twoLimiters(t *testing.T, b *testutil.Backend) (*redis.Client, []*funnel.Limiter) {
	c := b.Client(t)
	return c, []*funnel.Limiter{
		mustLimiter(t, c, funnel.WithPrefix(b.Prefix)),
		mustLimiter(t, c, funnel.WithPrefix(b.Prefix)),
	}
}
