package servercheck_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/funnelguard/funnelguard/servercheck"
	"github.com/redis/go-redis/v9"
)

// The number and the rule of the eviction tests: one code a day.
const phone = "+8613800138000"

var daily = funnel.AtMost(1, 24*time.Hour)

// usedMemory returns the server's used_memory.
func usedMemory(t testing.TB, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("INFO memory lacks used_memory:\n%s", info)
	return 0
}

// exhaust uses up phone's daily code on lim and checks that the next call
// is denied.
func exhaust(t testing.TB, lim *funnel.Limiter) {
	t.Helper()
	for i, want := range []bool{true, false} {
		res, err := lim.Allow(context.Background(), phone, daily)
		if err != nil || res.Allowed != want {
			t.Fatalf("call %d: Allow = %+v, %v; want allowed %v", i+1, res, err, want)
		}
	}
}

// filler is the value of the keys that fill the server: 64 KiB.
var filler = strings.Repeat("x", 64<<10)

// Why the check matters: under allkeys-lru, a full server evicts the state
// of a funnel whose limit was used up, and the next call is admitted as if
// the number had never had a code. Check reported the setting beforehand.
func TestEvictionDropsLimit(t *testing.T) {
	srv := testutil.StartServer(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := testutil.NewPrefix()
	lim, err := funnel.New(c, funnel.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	exhaust(t, lim)
	key := prefix + "{" + phone + "}:f"

	// LRU idle times tick once a second: let the funnel's key be the
	// oldest by two ticks, so that it is the first key LRU picks.
	time.Sleep(2200 * time.Millisecond)
	limit := usedMemory(t, c) + 1<<20
	configSet(t, c, "maxmemory-policy", "allkeys-lru")
	configSet(t, c, "maxmemory-samples", "64") // every key of this small server is sampled
	configSet(t, c, "maxmemory", strconv.FormatInt(limit, 10))
	if _, err := check(t, c, 5*time.Second); !errors.Is(err, servercheck.ErrEvictionPolicy) {
		t.Fatalf("Check = %v; want ErrEvictionPolicy", err)
	}

	// EXISTS does not touch a key's LRU time.
	fills := 0
	for ; c.Exists(ctx, key).Val() == 1; fills++ {
		if fills == 200 { // 12.5 MiB written through a 1 MiB margin
			t.Fatalf("the funnel's key %s survived %d fillers of %d bytes under allkeys-lru", key, fills, len(filler))
		}
		if err := c.Set(ctx, fmt.Sprintf("%sfill:%d", prefix, fills), filler, time.Hour).Err(); err != nil {
			t.Fatalf("SET filler %d: %v", fills, err)
		}
	}
	evicted := c.InfoMap(ctx, "stats").Item("Stats", "evicted_keys")
	res, err := lim.Allow(ctx, phone, daily)
	if err != nil || !res.Allowed {
		t.Fatalf("Allow after the eviction = %+v, %v; want allowed: the limit is gone", res, err)
	}
	t.Logf("%s, allkeys-lru, maxmemory = used_memory + 1 MiB (%d): the used-up funnel's key was evicted after %d fillers of 64 KiB (evicted_keys %s); the next Allow of the number was admitted",
		testutil.ServerName(), limit, fills, evicted)
}

// The safe setting: under noeviction a full server refuses writes with an
// OOM error and keeps every key. An admission and a lock fail with that
// error (fail closed); the used-up number stays denied.
func TestNoEvictionKeepsLimit(t *testing.T) {
	srv := testutil.StartServer(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := testutil.NewPrefix()
	lim, err := funnel.New(c, funnel.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	exhaust(t, lim)
	locker, err := mutex.New(c, mutex.WithPrefix(prefix+"lock:"))
	if err != nil {
		t.Fatal(err)
	}
	if lk, err := locker.TryLock(ctx, "warm"); err != nil { // the scripts are loaded before the server is full
		t.Fatal(err)
	} else if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// A full server: its memory limit below what it uses. (Filling it with
	// large values would leave it a value's size short of full, room
	// enough for the small writes of a funnel.)
	used := usedMemory(t, c)
	limit := used / 2
	configSet(t, c, "maxmemory-policy", "noeviction")
	configSet(t, c, "maxmemory", strconv.FormatInt(limit, 10))
	if findings, err := check(t, c, 5*time.Second); err != nil || findings[0].Note != "" {
		t.Fatalf("Check = %+v, %v; want safe", findings, err)
	}
	if err := c.Set(ctx, prefix+"fill", filler, time.Hour).Err(); !redis.IsOOMError(err) {
		t.Fatalf("SET on a full server: %v; want an OOM error", err)
	}
	if n := c.Exists(ctx, prefix+"{"+phone+"}:f").Val(); n != 1 {
		t.Fatalf("the funnel's key is gone under noeviction")
	}
	res, err := lim.Allow(ctx, phone, daily)
	t.Logf("%s, noeviction, full (maxmemory %d, used_memory %d): the used-up number: Allow = %+v, %v", testutil.ServerName(), limit, used, res, err)
	if err != nil || res.Allowed {
		t.Errorf("Allow of the used-up number = %+v, %v; want denied", res, err)
	}
	res, err = lim.Allow(ctx, "+8613900139000", daily)
	t.Logf("another number: Allow = %+v, %v", res, err)
	if !redis.IsOOMError(err) || res.Allowed {
		t.Errorf("Allow of another number = %+v, %v; want an OOM error", res, err)
	}
	lk, err := locker.TryLock(ctx, "name")
	t.Logf("TryLock = %v, %v", lk, err)
	if !redis.IsOOMError(err) || lk != nil {
		t.Errorf("TryLock = %v, %v; want an OOM error", lk, err)
	}
}
