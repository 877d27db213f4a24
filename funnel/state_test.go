package funnel_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// TestIdleKeyExpires checks that the state key lives exactly until every
// funnel is empty, that its TTL never shrinks below what another rule's state
// needs, that no lock key is left behind, and that a denial writes nothing.
func TestIdleKeyExpires(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		lim := newLimiter(t, b)
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		setTime := func(d time.Duration) {
			if b.Mini != nil {
				b.Mini.SetTime(t0.Add(d))
			}
		}
		cooldown := funnel.AtMost(1, time.Minute)
		// A unit of slow drains in 3600 s / 7: not a whole number of ms, so
		// the TTL must round up.
		slow := funnel.Rule{Name: "7/h", Capacity: 3, Leak: 7, Per: time.Hour}
		key := b.Prefix + "{k}:f"
		pttl := func() time.Duration {
			t.Helper()
			d, err := c.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			return d
		}

		setTime(0)
		start := time.Now()
		res, err := lim.Allow(ctx, "k", cooldown, slow)
		if err != nil || !res.Allowed {
			t.Fatalf("Allow = %+v, %v", res, err)
		}
		// slow holds one unit: empty in ⌈3600 s / 7⌉ µs, a TTL of that in ms
		// rounded up.
		if got, want := res.ResetAfter, 514285715*time.Microsecond; got != want {
			t.Fatalf("ResetAfter = %v, want %v", got, want)
		}
		// The key lives to the grid point at or after that (ms, + 1 for
		// the µs TIME may have past its ms; slow's grid is the larger).
		grid := funnel.Grid(slow)
		need := 514286 * time.Millisecond
		got := pttl()
		if got < need-time.Since(start)-time.Millisecond || got > need+grid+time.Millisecond {
			t.Fatalf("PTTL = %v after an admission, want %v (less the time since) up to the next grid point (%v)", got, need, grid)
		}
		if b.Mini != nil {
			at := t0.UnixMilli() + need.Milliseconds() + 1
			g := grid.Milliseconds()
			if want := time.Duration(at+(g-at%g)%g-t0.UnixMilli()) * time.Millisecond; got != want {
				t.Fatalf("PTTL = %v, want exactly %v on a frozen clock", got, want)
			}
		}
		if keys := testutil.WithoutRecords(keysUnder(t, c, b.Prefix)); len(keys) != 1 || keys[0] != key {
			t.Fatalf("keys %q after an admission, want only %q (no lock left)", keys, key)
		}

		// A call with only a minute rule needs a one-minute TTL, but slow's
		// unit is still stored: the TTL must not shrink.
		minute := funnel.Rule{Name: "minute", Capacity: 5, Leak: 1, Per: time.Minute}
		before := pttl()
		if res, err := lim.Allow(ctx, "k", minute); err != nil || !res.Allowed {
			t.Fatalf("minute rule only = %+v, %v", res, err)
		}
		if got := pttl(); got < before-time.Since(start) {
			t.Fatalf("PTTL = %v after a minute-rule-only admission, was %v: the slow rule's state would expire early", got, before)
		}

		// A denial (the cooldown is full) writes nothing.
		setTime(time.Second)
		time.Sleep(time.Millisecond) // a real server's clock moves on, as a write would show
		hash, err := c.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		before = pttl()
		res, err = lim.Allow(ctx, "k", cooldown, slow)
		if err != nil || res.Allowed {
			t.Fatalf("Allow within the cooldown = %+v, %v; want denied", res, err)
		}
		after, err := c.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(hash, after) {
			t.Fatalf("a denial changed the state:\n%q\n%q", hash, after)
		}
		if got := pttl(); got > before || (b.Mini != nil && got != before) {
			t.Fatalf("a denial changed the TTL from %v to %v", before, got)
		}

		if b.Mini != nil {
			left := pttl()
			b.Mini.FastForward(left - time.Millisecond)
			if n := c.Exists(ctx, key).Val(); n != 1 {
				t.Fatalf("state gone %v before its TTL", time.Millisecond)
			}
			b.Mini.FastForward(time.Millisecond)
			if n := c.Exists(ctx, key).Val(); n != 0 {
				t.Fatal("state left after its TTL")
			}
			return
		}

		// A real server: a funnel that empties in 50 ms.
		fast := funnel.Rule{Name: "fast", Capacity: 1, Leak: 1, Per: 50 * time.Millisecond}
		fkey := b.Prefix + "{fast}:f"
		if res, err := lim.Allow(ctx, "fast", fast); err != nil || !res.Allowed {
			t.Fatalf("Allow = %+v, %v", res, err)
		}
		if d, most := c.PTTL(ctx, fkey).Val(), fast.Per+funnel.Grid(fast)+time.Millisecond; d <= 0 || d > most {
			t.Fatalf("PTTL = %v, want in (0, %v]", d, most)
		}
		for deadline := time.Now().Add(2 * time.Second); c.Exists(ctx, fkey).Val() != 0; {
			if time.Now().After(deadline) {
				t.Fatalf("state of a funnel that emptied in %v still there after 2s", fast.Per)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// TestMemoryUsage reports what an active key costs in Redis and catches
// growth of the stored state (the bench program, bench/, sets it beside
// redis_rate's for the same traffic).
func TestMemoryUsage(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	c := b.Client(t)
	lim := newLimiter(t, b)
	sms := []funnel.Rule{funnel.AtMost(1, time.Minute), funnel.AtMost(5, time.Hour), funnel.AtMost(10, 24*time.Hour)}
	one := funnel.AtMost(5, time.Hour)

	if res, err := lim.Allow(ctx, "three", sms...); err != nil || !res.Allowed {
		t.Fatalf("Allow = %+v, %v", res, err)
	}
	for range 2 {
		if res, err := lim.Allow(ctx, "one", one); err != nil || !res.Allowed {
			t.Fatalf("Allow = %+v, %v", res, err)
		}
	}
	usage := func(key string) int64 {
		t.Helper()
		n, err := c.MemoryUsage(ctx, key).Result()
		if err != nil {
			t.Fatalf("MEMORY USAGE %s: %v", key, err)
		}
		return n
	}
	three, single := usage(b.Prefix+"{three}:f"), usage(b.Prefix+"{one}:f")
	t.Logf("MEMORY USAGE: funnel 3 rules %d B, funnel 1 rule %d B (keys of %d, %d bytes)",
		three, single, len(b.Prefix+"{three}:f"), len(b.Prefix+"{one}:f"))
	if keys := testutil.WithoutRecords(keysUnder(t, c, b.Prefix)); len(keys) != 2 {
		t.Fatalf("keys %q, want the two state keys only", keys)
	}
	const most = 512
	if three > most {
		t.Fatalf("a 3-rule key takes %d bytes, want at most %d", three, most)
	}
}
