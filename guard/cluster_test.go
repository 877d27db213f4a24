package guard_test

// The tests of this file run a Guard on more than one server: on a Redis
// Cluster of three masters through a *redis.ClusterClient, and on a
// sentinel-monitored master and replica through redis.NewFailoverClient
// (testutil.ScaleOut).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// braceKeys are user keys with braces, which must neither split the keys of
// one user key over slots nor choose another key's slot.
var braceKeys = []string{"{", "}", "a{b}c", "}{", "{}", "b}x", "b"}

// scaleGuard returns a Guard on client under prefix, allowing two calls an
// hour per key. Its Locker fences, so that every key leaves two keys in
// Redis after a call: its funnel state and its fence counter.
func scaleGuard(t *testing.T, client redis.UniversalClient, prefix string) *guard.Guard {
	t.Helper()
	locker, err := mutex.New(client, mutex.WithPrefix(prefix), mutex.WithFencing())
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(client,
		guard.WithPrefix(prefix),
		guard.WithRules(funnel.AtMost(2, time.Hour)),
		guard.WithTimeout(5*time.Second), // a bound, not a speed requirement
		guard.WithFunnel(funnel.WithLocker(locker)),
	)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestClusterGuardAllowRefundDo(t *testing.T) {
	testutil.ScaleOut(t, func(t *testing.T, d *testutil.Deployment) {
		ctx := context.Background()
		g := scaleGuard(t, d.Client(t), d.Prefix)
		for _, key := range braceKeys {
			for i := range 2 {
				if dec, err := g.Allow(ctx, key); err != nil || !dec.Allowed || dec.Degraded {
					t.Fatalf("Allow(%q) #%d = %+v, %v; want allowed", key, i, dec, err)
				}
			}
			dec, err := g.Allow(ctx, key)
			if err != nil || dec.Allowed || dec.Rule != "2/1h0m0s" || dec.RetryAfter <= 59*time.Minute || dec.RetryAfter > time.Hour {
				t.Fatalf("third Allow(%q) = %+v, %v; want denied by 2/1h0m0s for ~1h", key, dec, err)
			}
			if err := g.Refund(ctx, key); err != nil {
				t.Fatalf("Refund(%q) = %v", key, err)
			}
			// Do refunds the unit when the call fails, so it can run again.
			failed := errors.New("provider refused")
			for i := range 3 {
				dec, err := g.Do(ctx, key, func(context.Context) error { return failed })
				if !dec.Allowed || !errors.Is(err, failed) {
					t.Fatalf("Do(%q) #%d with a failing call = %+v, %v; want admitted and refunded", key, i, dec, err)
				}
			}
			ran := false
			if dec, err := g.Do(ctx, key, func(context.Context) error { ran = true; return nil }); err != nil || !dec.Allowed || !ran {
				t.Fatalf("Do(%q) = %+v, %v, ran %v; want admitted", key, dec, err, ran)
			}
			if dec, err := g.Allow(ctx, key); err != nil || dec.Allowed {
				t.Fatalf("Allow(%q) after a successful Do = %+v, %v; want denied", key, dec, err)
			}
		}
	})
}

// Every key that one user key touches lies in one slot of one master, for
// keys with braces too; brace keys do not share slots; and the keys of
// different user keys spread over all three masters.
func TestClusterGuardKeysShareASlotAndSpread(t *testing.T) {
	c := testutil.Cluster(t)
	cl := c.Client(t)
	ctx := context.Background()
	base := c.Prefix(t)
	keys := slices.Clone(braceKeys)
	for i := range 30 {
		keys = append(keys, fmt.Sprintf("+86138001380%02d", i))
	}
	// A prefix per user key: every key under it belongs to that user key.
	prefixOf := func(i int) string { return fmt.Sprintf("%su%d:", base, i) }
	for i, key := range keys {
		g := scaleGuard(t, cl, prefixOf(i))
		// Twice: the first, on a key with no state, is admitted in one
		// round trip without the lock; the second takes it (and a fence).
		for range 2 {
			if dec, err := g.Allow(ctx, key); err != nil || !dec.Allowed {
				t.Fatalf("Allow(%q) = %+v, %v", key, dec, err) // CROSSSLOT fails here
			}
		}
	}

	type found struct{ master, key string }
	var mu sync.Mutex
	var all []found
	err := cl.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		iter := m.Scan(ctx, 0, base+"*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			all = append(all, found{m.Options().Addr, iter.Val()})
			mu.Unlock()
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	masters := map[string]int{}  // user keys per master
	slotOf := map[int64]string{} // brace keys by slot
	for i, key := range keys {
		var mine []found
		for _, f := range all {
			if strings.HasPrefix(f.key, prefixOf(i)) && !testutil.IsRecord(f.key) {
				mine = append(mine, f)
			}
		}
		if len(mine) != 2 {
			t.Fatalf("user key %q left %d keys %v, want 2 (state and fence)", key, len(mine), mine)
		}
		var slot int64 = -1
		for _, f := range mine {
			s, err := cl.ClusterKeySlot(ctx, f.key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if f.master != mine[0].master || (slot >= 0 && s != slot) {
				t.Fatalf("keys of %q in two places: %v (slots %d, %d)", key, mine, slot, s)
			}
			slot = s
		}
		node := redis.NewClient(&redis.Options{Addr: mine[0].master})
		n, err := node.ClusterCountKeysInSlot(ctx, int(slot)).Result()
		node.Close()
		if err != nil || n < 2 {
			t.Fatalf("CLUSTER COUNTKEYSINSLOT %d on %s = %d, %v; want the 2 keys of %q", slot, mine[0].master, n, err, key)
		}
		masters[mine[0].master]++
		if slices.Contains(braceKeys, key) {
			// Unescaped, "b}x" would close the hash tag early and share the
			// slot of "b", and "}" that of "}{".
			if prev, dup := slotOf[slot]; dup {
				t.Fatalf("user keys %q and %q share slot %d", prev, key, slot)
			}
			slotOf[slot] = key
		}
	}
	if len(masters) != 3 {
		t.Fatalf("user keys per master %v: want keys on all 3 masters", masters)
	}
	t.Logf("%d user keys per master: %v", len(keys), masters)
}

// TestClusterGuardInFlight: a key's InFlight semaphore keeps its bound on a
// Cluster and behind Sentinel, whatever braces the key holds (its keys
// share one slot: no CROSSSLOT), and one key's does not hold up another's.
func TestClusterGuardInFlight(t *testing.T) {
	testutil.ScaleOut(t, func(t *testing.T, d *testutil.Deployment) {
		ctx := context.Background()
		g, err := guard.New(d.Client(t), guard.WithPrefix(d.Prefix), guard.WithRules(plenty...), guard.WithInFlight(1), guard.WithTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range braceKeys {
			_, wait := holdKey(t, g, key)
			if _, err := g.Do(ctx, key, func(context.Context) error { return nil }); !errors.Is(err, guard.ErrBusy) {
				t.Errorf("Do(%q) while its permit is held = %v, want ErrBusy", key, err)
			}
			if _, err := g.Do(ctx, key+"x", func(context.Context) error { return nil }); err != nil {
				t.Errorf("Do(%q) while %q's permit is held = %v, want it run", key+"x", key, err)
			}
			if err := wait(); err != nil {
				t.Fatalf("Do(%q) holding the permit = %v", key, err)
			}
		}
	})
}
