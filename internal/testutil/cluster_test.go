package testutil_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// The shared cluster is started once, has three masters that split the
// slots between them, and its client reaches keys of every slot.
func TestClusterServes(t *testing.T) {
	c := testutil.Cluster(t)
	t.Logf("cluster %v started in %v", c.Addrs, c.Took)
	if got := testutil.Cluster(t); got != c {
		t.Fatal("Cluster started a second cluster in one test binary")
	}
	ctx := context.Background()
	cl := c.Client(t)
	prefix := c.Prefix(t)
	const keys = 60
	for i := range keys {
		if err := cl.Set(ctx, fmt.Sprintf("%s%d", prefix, i), i, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	perMaster := map[string]int{}
	err := cl.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n := 0
		iter := m.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			n++
		}
		mu.Lock()
		perMaster[m.Options().Addr] = n
		mu.Unlock()
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for addr, n := range perMaster {
		if !slices.Contains(c.Addrs, addr) {
			t.Errorf("master %s is not one of %v", addr, c.Addrs)
		}
		if n == 0 {
			t.Errorf("master %s holds none of %d keys: %v", addr, keys, perMaster)
		}
		total += n
	}
	if len(perMaster) != 3 || total != keys {
		t.Fatalf("keys per master %v, want %d keys over 3 masters", perMaster, keys)
	}
}

// The shared sentinel group is started once; its failover client writes to
// the master, and the replica receives the writes.
func TestSentinelServes(t *testing.T) {
	g := testutil.Sentinel(t)
	t.Logf("sentinel group (sentinels %v) started in %v", g.SentinelAddrs, g.Took)
	if got := testutil.Sentinel(t); got != g {
		t.Fatal("Sentinel started a second group in one test binary")
	}
	ctx := context.Background()
	key := g.Prefix(t) + "k"
	if err := g.Client(t).Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	master := g.Master(t)
	if master != g.Data[0] {
		t.Fatalf("master %s, want the first data server %s", master.Addr, g.Data[0].Addr)
	}
	replica := g.Data[1].Client(t)
	deadline := time.Now().Add(5 * time.Second)
	for replica.Get(ctx, key).Val() != "v" {
		if time.Now().After(deadline) {
			t.Fatal("the write did not reach the replica")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// KillMaster kills the master by pid; the replica takes over, keeps the
// data replicated before the kill, and the failover client finds it.
func TestSentinelKillMaster(t *testing.T) {
	if testing.Short() {
		t.Skip("a failover takes seconds")
	}
	g := testutil.StartSentinel(t)
	t.Logf("own sentinel group started in %v", g.Took)
	ctx := context.Background()
	c := g.ClientOpts(t, &redis.FailoverOptions{DialTimeout: 500 * time.Millisecond})
	key := g.Prefix(t) + "k"
	if err := c.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	old := g.Master(t)
	if n, err := old.Client(t).Wait(ctx, 1, 5000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v: the replica did not acknowledge", n, err)
	}
	newAddr, took := g.KillMaster(t)
	t.Logf("failover from %s to %s took %v", old.Addr, newAddr, took)
	if newAddr != g.Data[1].Addr {
		t.Fatalf("new master %s, want the replica %s", newAddr, g.Data[1].Addr)
	}
	if err := old.Client(t).Ping(ctx).Err(); err == nil {
		t.Fatal("the old master still answers after KillMaster")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := c.Get(ctx, key).Result()
		if err == nil {
			if got != "v" {
				t.Fatalf("GET after failover = %q, want v", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the failover client did not reach the new master: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
