package funnel_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// sleepTo sleeps, in a synctest bubble, until d after start on the
// bubble's clock, which stands still while the test's calls run.
func sleepTo(start time.Time, d time.Duration) { time.Sleep(time.Until(start.Add(d))) }

// cachedLimiter returns a Limiter with a deny cache of maxKeys keys on a
// fresh client of b, and a counter of the commands that client sends.
func cachedLimiter(t *testing.T, b *testutil.Backend, maxKeys int, opts ...funnel.Option) (*funnel.Limiter, *testutil.CommandCounter) {
	t.Helper()
	client := b.Client(t)
	counter := &testutil.CommandCounter{}
	client.AddHook(counter)
	opts = append([]funnel.Option{funnel.WithPrefix(b.Prefix), funnel.WithDenyCache(maxKeys)}, opts...)
	return mustLimiter(t, client, opts...), counter
}

// counted calls lim.AllowN and returns its Result and how many commands it
// sent; it fails t on an error.
func counted(t *testing.T, lim *funnel.Limiter, cmds *testutil.CommandCounter, key string, n int64, rules ...funnel.Rule) (funnel.Result, int64) {
	t.Helper()
	before := cmds.N.Load()
	res, err := lim.AllowN(context.Background(), key, n, rules...)
	if err != nil {
		t.Fatalf("AllowN(%q, %d): %v", key, n, err)
	}
	return res, cmds.N.Load() - before
}

// peek is lim.Peek, failing t on an error.
func peek(t *testing.T, lim *funnel.Limiter, key string, rules ...funnel.Rule) funnel.Result {
	t.Helper()
	res, err := lim.Peek(context.Background(), key, rules...)
	if err != nil {
		t.Fatalf("Peek(%q): %v", key, err)
	}
	return res
}

// A denial is answered in-process, with 0 commands, until its gate time on
// the cache's clock, with the Result a Redis read would give at the same
// point (RetryAfter and ResetAfter counting down); at the gate time the
// call goes to Redis. The server clock (miniredis) and the cache's clock
// are set years apart: only the wait carries over, as a duration. With
// batching and without.
func TestDenyCacheGateTime(t *testing.T) {
	t.Run("batched", func(t *testing.T) { testDenyCacheGateTime(t) })
	t.Run("alone", func(t *testing.T) { testDenyCacheGateTime(t, funnel.WithoutBatching()) })
}

func testDenyCacheGateTime(t *testing.T, opts ...funnel.Option) {
	b := testutil.Mini(t) // outside the bubble: its server blocks on the network
	synctest.Test(t, func(t *testing.T) { denyCacheGateTime(t, b, opts...) })
}

func denyCacheGateTime(t *testing.T, b *testutil.Backend, opts ...funnel.Option) {
	lim, cmds := cachedLimiter(t, b, 100, opts...)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c0 := time.Now() // the bubble's clock: 2000-01-01
	at := func(d time.Duration) { b.Mini.SetTime(t0.Add(d)); sleepTo(c0, d) }
	cooldown := funnel.AtMost(1, time.Minute)
	const key = "+8613800138000"

	at(0)
	if res, n := counted(t, lim, cmds, key, 1, cooldown); !res.Allowed || n == 0 {
		t.Fatalf("first call: %+v, %d commands; want admitted by Redis", res, n)
	}
	denied, n := counted(t, lim, cmds, key, 1, cooldown)
	if denied.Allowed || denied.RetryAfter != time.Minute || n == 0 {
		t.Fatalf("second call: %+v, %d commands; want denied by Redis for 1m", denied, n)
	}
	if p := peek(t, lim, key, cooldown); p != denied {
		t.Fatalf("Redis denied with %+v but Peek says %+v", denied, p)
	}
	for i := range 10 {
		if res, n := counted(t, lim, cmds, key, 1, cooldown); res != denied || n != 0 {
			t.Fatalf("call %d at the denial's time: %+v, %d commands; want %+v from the cache", i, res, n, denied)
		}
	}
	for _, d := range []time.Duration{10 * time.Second, 59 * time.Second, time.Minute - time.Microsecond, time.Minute - time.Nanosecond} {
		at(d)
		res, n := counted(t, lim, cmds, key, 1, cooldown)
		if n != 0 || res.Allowed || res.RetryAfter != time.Minute-d {
			t.Fatalf("at +%v: %+v, %d commands; want a cached denial with RetryAfter %v", d, res, n, time.Minute-d)
		}
		if d%time.Microsecond == 0 { // Redis counts in µs
			if p := peek(t, lim, key, cooldown); res != p {
				t.Fatalf("at +%v: cached %+v, Redis %+v", d, res, p)
			}
		}
	}
	at(time.Minute) // the gate time: Redis decides
	if res, n := counted(t, lim, cmds, key, 1, cooldown); !res.Allowed || n == 0 {
		t.Fatalf("at the gate time: %+v, %d commands; want admitted by Redis", res, n)
	}
	// The next denial is cached from its own gate time.
	if res, n := counted(t, lim, cmds, key, 1, cooldown); res.Allowed || res.RetryAfter != time.Minute || n == 0 {
		t.Fatalf("after the gate time: %+v, %d commands; want denied by Redis for 1m", res, n)
	}
	if res, n := counted(t, lim, cmds, key, 1, cooldown); res.Allowed || n != 0 {
		t.Fatalf("again: %+v, %d commands; want a cached denial", res, n)
	}
}

// On the real clock, the cache never denies past the gate time: a cached
// denial's RetryAfter is never more than Redis's just before, and a call
// the cache lets through is admitted or denied by Redis for at most about a
// round trip.
func TestDenyCacheNeverPastGate(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		lim, cmds := cachedLimiter(t, b, 100)
		rule := funnel.AtMost(1, 300*time.Millisecond)
		if res, _ := counted(t, lim, cmds, "k", 1, rule); !res.Allowed {
			t.Fatalf("first call denied: %+v", res)
		}
		if res, n := counted(t, lim, cmds, "k", 1, rule); res.Allowed || n == 0 {
			t.Fatalf("second call: %+v, %d commands; want denied by Redis", res, n)
		}
		hits := 0
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			p := peek(t, lim, "k", rule)
			res, n := counted(t, lim, cmds, "k", 1, rule)
			if n == 0 {
				hits++
				if p.Allowed || res.Allowed || res.RetryAfter > p.RetryAfter {
					t.Fatalf("cached %+v after Redis said %+v", res, p)
				}
				continue
			}
			if res.Allowed {
				if hits == 0 {
					t.Fatal("no call was answered from the cache")
				}
				return
			}
			// The cache let the call through before the gate time by at
			// most the first denial's way to Redis.
			if res.RetryAfter > 100*time.Millisecond {
				t.Fatalf("the cache let through a call denied for %v", res.RetryAfter)
			}
		}
		t.Fatal("never admitted")
	})
}

// A hit needs the same rule set (the same rules in the same order) and at
// least as many units as the cached denial; the key's latest denial
// replaces its entry. Calls of more than four rules never hit.
func TestDenyCacheMatch(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		lim, cmds := cachedLimiter(t, b, 100)
		five := funnel.Rule{Name: "five", Capacity: 5, Leak: 1, Per: time.Hour}
		day := funnel.AtMost(10, 24*time.Hour)
		const key = "k"
		hit := func(what string, n int64, rules ...funnel.Rule) funnel.Result {
			t.Helper()
			res, c := counted(t, lim, cmds, key, n, rules...)
			if res.Allowed || c != 0 {
				t.Fatalf("%s: %+v, %d commands; want a cached denial", what, res, c)
			}
			return res
		}
		miss := func(what string, n int64, rules ...funnel.Rule) funnel.Result {
			t.Helper()
			res, c := counted(t, lim, cmds, key, n, rules...)
			if res.Allowed || c == 0 {
				t.Fatalf("%s: %+v, %d commands; want a denial by Redis", what, res, c)
			}
			return res
		}
		if res, _ := counted(t, lim, cmds, key, 5, five); !res.Allowed {
			t.Fatalf("5 units: %+v", res)
		}
		two := miss("2 units", 2, five)
		hit("2 units again", 2, five)
		if res := hit("3 units", 3, five); res.RetryAfter > two.RetryAfter || res.Rule != "five" {
			t.Fatalf("3 units: %+v; want the cached wait of 2 units (%v) or less", res, two.RetryAfter)
		}
		miss("1 unit: fewer than cached", 1, five)
		hit("1 unit again", 1, five)
		hit("2 units after 1", 2, five)

		miss("other rules", 1, five, day)
		hit("other rules again", 1, five, day)
		miss("the first rules: replaced", 1, five)
		miss("the rules in another order", 1, day, five)

		many := []funnel.Rule{five, day, funnel.AtMost(20, 24*time.Hour), funnel.AtMost(30, 24*time.Hour), funnel.AtMost(40, 24*time.Hour)}
		miss("5 rules", 1, many...)
		miss("5 rules again: never cached", 1, many...)
	})
}

// A Refund or Reset through the Limiter clears the key's entry at once:
// the next call goes to Redis and is admitted. A refund of another key
// leaves it.
func TestDenyCacheRefundReset(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		lim, cmds := cachedLimiter(t, b, 100)
		rule := funnel.AtMost(1, time.Hour)
		deny := func(what string) {
			t.Helper()
			if res, n := counted(t, lim, cmds, "k", 1, rule); res.Allowed || n == 0 {
				t.Fatalf("%s: %+v, %d commands; want denied by Redis", what, res, n)
			}
			if res, n := counted(t, lim, cmds, "k", 1, rule); res.Allowed || n != 0 {
				t.Fatalf("%s, again: %+v, %d commands; want denied by the cache", what, res, n)
			}
		}
		admit := func(what string) {
			t.Helper()
			if res, n := counted(t, lim, cmds, "k", 1, rule); !res.Allowed || n == 0 {
				t.Fatalf("%s: %+v, %d commands; want admitted by Redis", what, res, n)
			}
		}
		admit("first call")
		deny("second call")
		if err := lim.Refund(ctx, "other", 1, rule); err != nil {
			t.Fatal(err)
		}
		if res, n := counted(t, lim, cmds, "k", 1, rule); res.Allowed || n != 0 {
			t.Fatalf("after a refund of another key: %+v, %d commands; want denied by the cache", res, n)
		}
		if err := lim.Refund(ctx, "k", 1, rule); err != nil {
			t.Fatal(err)
		}
		if l := funnel.DenyCacheLen(lim); l != 0 {
			t.Fatalf("%d entries after the refund", l)
		}
		admit("after the refund")
		deny("after the refund, again")
		if err := lim.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		admit("after the reset")
		deny("after the reset, again")
	})
}

// Two processes (two Limiters with caches) on one Redis: a refund or reset
// in A takes effect in A at once and in B at B's cached gate time T at the
// latest. B keeps denying from its cache, though Redis would admit, until T;
// at T it asks Redis and sees the state the refund left.
func TestDenyCacheOtherProcess(t *testing.T) {
	for _, op := range []struct {
		name string
		do   func(ctx context.Context, lim *funnel.Limiter, key string, rule funnel.Rule) error
	}{
		{"refund", func(ctx context.Context, lim *funnel.Limiter, key string, rule funnel.Rule) error {
			return lim.Refund(ctx, key, 3, rule)
		}},
		{"reset", func(ctx context.Context, lim *funnel.Limiter, key string, _ funnel.Rule) error {
			return lim.Reset(ctx, key)
		}},
	} {
		t.Run(op.name, func(t *testing.T) {
			b := testutil.Mini(t)
			synctest.Test(t, func(t *testing.T) {
				a, aCmds := cachedLimiter(t, b, 100)
				p, pCmds := cachedLimiter(t, b, 100) // "B"
				t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
				c0 := time.Now()
				at := func(d time.Duration) {
					b.Mini.SetTime(t0.Add(d))
					sleepTo(c0, d)
				}
				rule := funnel.Rule{Name: "r", Capacity: 3, Leak: 1, Per: time.Hour} // a unit an hour
				const key = "k"

				at(0)
				if res, _ := counted(t, a, aCmds, key, 3, rule); !res.Allowed {
					t.Fatalf("A takes 3: %+v", res)
				}
				if res, n := counted(t, p, pCmds, key, 1, rule); res.Allowed || res.RetryAfter != time.Hour || n == 0 {
					t.Fatalf("B: %+v, %d commands; want denied by Redis for 1h", res, n)
				}
				if res, n := counted(t, a, aCmds, key, 1, rule); res.Allowed || n == 0 {
					t.Fatalf("A: %+v, %d commands; want denied by Redis", res, n)
				}

				at(10 * time.Minute)
				if err := op.do(context.Background(), a, key, rule); err != nil {
					t.Fatal(err)
				}
				// In A at once: its own entry is gone.
				if res, n := counted(t, a, aCmds, key, 1, rule); !res.Allowed || n == 0 || res.Remaining != 2 {
					t.Fatalf("A after its %s: %+v, %d commands; want admitted by Redis, 2 left", op.name, res, n)
				}
				// In B at T at the latest: it denies from its cache, though
				// Redis would admit it.
				for _, d := range []time.Duration{10 * time.Minute, 59 * time.Minute, time.Hour - time.Nanosecond} {
					at(d)
					res, n := counted(t, p, pCmds, key, 1, rule)
					if res.Allowed || n != 0 || res.RetryAfter != time.Hour-d {
						t.Fatalf("B at +%v: %+v, %d commands; want its cached denial, RetryAfter %v", d, res, n, time.Hour-d)
					}
					if pk := peek(t, p, key, rule); !pk.Allowed {
						t.Fatalf("B at +%v: Redis says %+v; want room", d, pk)
					}
				}
				// At T, B asks Redis and sees the refund: one unit (A's) is left
				// in the funnel, 5/6 of it leaked, and B's unit on top leaves
				// room for one more. Without the refund B's call would leave 0.
				at(time.Hour)
				res, n := counted(t, p, pCmds, key, 1, rule)
				if !res.Allowed || n == 0 || res.Remaining != 1 {
					t.Fatalf("B at T: %+v, %d commands; want admitted by Redis with 1 left", res, n)
				}
			})
		})
	}
}

// afterHook runs a function once, after the next command a client sends.
type afterHook struct{ next atomic.Pointer[func()] }

func (h *afterHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *afterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if f := h.next.Swap(nil); f != nil {
			(*f)()
		}
		return err
	}
}

func (h *afterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if f := h.next.Swap(nil); f != nil {
			(*f)()
		}
		return err
	}
}

// A denial read before a Refund through the same Limiter committed, but
// returned after it, is not cached: the cache would otherwise deny a key
// that the refund just opened.
func TestDenyCacheEpoch(t *testing.T) {
	t.Run("direct", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := funnel.NewDenyCache(10)
			set := new(funnel.RuleSet)
			deny := funnel.Result{Rule: "r", Tightest: "r", RetryAfter: time.Minute, ResetAfter: time.Minute}
			epoch := c.Epoch()
			c.Forget("other") // any key: the epoch counts every forget
			c.Store("k", set, 1, time.Now(), epoch, deny)
			if res, ok := c.Lookup("k", set, 1); ok {
				t.Fatalf("a denial from before a forget was cached: %+v", res)
			}
			c.Store("k", set, 1, time.Now(), c.Epoch(), deny)
			if res, ok := c.Lookup("k", set, 1); !ok || res != deny {
				t.Fatalf("Lookup = %+v, %v; want %+v", res, ok, deny)
			}
			c.Forget("k")
			if _, ok := c.Lookup("k", set, 1); ok || c.Len() != 0 {
				t.Fatalf("after Forget: hit %v, %d entries", ok, c.Len())
			}
		})
	})
	t.Run("limiter", func(t *testing.T) {
		testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
			ctx := context.Background()
			client := b.Client(t)
			cmds := &testutil.CommandCounter{}
			after := &afterHook{}
			client.AddHook(cmds)
			client.AddHook(after)
			lim := mustLimiter(t, client, funnel.WithPrefix(b.Prefix), funnel.WithDenyCache(100))
			rule := funnel.AtMost(1, time.Hour)
			for range 2 { // every gate's script loaded: the hook's next command is the read
				counted(t, lim, cmds, "warm-up", 1, rule)
			}
			if res, _ := counted(t, lim, cmds, "k", 1, rule); !res.Allowed {
				t.Fatalf("first call: %+v", res)
			}
			// The refund commits after the next call's read, before it
			// returns.
			refunded := make(chan error, 1)
			refund := func() { refunded <- lim.Refund(ctx, "k", 1, rule) }
			after.next.Store(&refund)
			if res, _ := counted(t, lim, cmds, "k", 1, rule); res.Allowed {
				t.Fatalf("the call read before the refund: %+v", res)
			}
			if err := <-refunded; err != nil {
				t.Fatal(err)
			}
			if res, n := counted(t, lim, cmds, "k", 1, rule); !res.Allowed || n == 0 {
				t.Fatalf("after the refund: %+v, %d commands; want admitted by Redis", res, n)
			}
		})
	})
}

// The cache holds at most maxKeys entries whatever the traffic: a million
// distinct denied keys through a cache of 10,000 never make it hold more, or
// keep much memory; the latest keys stay.
func TestDenyCacheBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxKeys, keys = 10_000, 1_000_000
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := funnel.NewDenyCache(maxKeys)
		set := new(funnel.RuleSet)
		deny := funnel.Result{Rule: "r", Tightest: "r", RetryAfter: time.Hour, ResetAfter: time.Hour}
		var buf []byte
		for i := range keys {
			buf = strconv.AppendInt(append(buf[:0], "key:"...), int64(i), 10)
			c.Store(string(buf), set, 1, time.Now(), c.Epoch(), deny)
			if l := c.Len(); l > maxKeys {
				t.Fatalf("%d entries after %d keys", l, i+1)
			}
		}
		if l := c.Len(); l != maxKeys {
			t.Fatalf("%d entries, want %d", l, maxKeys)
		}
		for _, i := range []int{keys - 1, keys - maxKeys} {
			if _, ok := c.Lookup("key:"+strconv.Itoa(i), set, 1); !ok {
				t.Fatalf("key %d, among the latest %d, was evicted", i, maxKeys)
			}
		}
		for _, i := range []int{0, keys - maxKeys - 1} {
			if _, ok := c.Lookup("key:"+strconv.Itoa(i), set, 1); ok {
				t.Fatalf("key %d is still cached", i)
			}
		}
		// Stored again, a key becomes the newest: the other keys go in order.
		c.Store("key:"+strconv.Itoa(keys-maxKeys), set, 1, time.Now(), c.Epoch(), deny)
		c.Store("new", set, 1, time.Now(), c.Epoch(), deny)
		if _, ok := c.Lookup("key:"+strconv.Itoa(keys-maxKeys), set, 1); !ok {
			t.Fatal("a key stored again was evicted as the oldest")
		}
		if _, ok := c.Lookup("key:"+strconv.Itoa(keys-maxKeys+1), set, 1); ok {
			t.Fatal("the oldest key was not evicted")
		}
		if l := c.Len(); l != maxKeys {
			t.Fatalf("%d entries, want %d", l, maxKeys)
		}
		if err := c.Check(); err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		// 10,000 entries take a few MB; a million would take hundreds.
		if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 32<<20 {
			t.Fatalf("the heap grew by %d MB for %d entries", grew>>20, c.Len())
		}
		runtime.KeepAlive(c)
	})
}

// A key stored again and again (a batch of denials, one store each) evicts
// no other key; forgotten entries' room is reused.
func TestDenyCacheHotKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := funnel.NewDenyCache(10)
		set := new(funnel.RuleSet)
		deny := funnel.Result{Rule: "r", RetryAfter: time.Hour}
		for i := range 10 {
			c.Store("k"+strconv.Itoa(i), set, 1, time.Now(), c.Epoch(), deny)
		}
		for range 1000 {
			c.Store("k9", set, 1, time.Now(), c.Epoch(), deny)
		}
		for i := range 10 {
			if _, ok := c.Lookup("k"+strconv.Itoa(i), set, 1); !ok {
				t.Fatalf("k%d was evicted by the stores of k9", i)
			}
		}
		c.Forget("k3")
		c.Forget("k5")
		c.Store("a", set, 1, time.Now(), c.Epoch(), deny)
		c.Store("b", set, 1, time.Now(), c.Epoch(), deny)
		for _, k := range []string{"k0", "k9", "a", "b"} {
			if _, ok := c.Lookup(k, set, 1); !ok {
				t.Fatalf("%s is not cached: a forgotten entry's room was not reused", k)
			}
		}
		c.Store("c", set, 1, time.Now(), c.Epoch(), deny) // evicts the oldest, k0
		if _, ok := c.Lookup("k0", set, 1); ok || c.Len() != 10 {
			t.Fatalf("k0 cached %v, %d entries; want k0 evicted, 10 entries", ok, c.Len())
		}
		if err := c.Check(); err != nil {
			t.Fatal(err)
		}
	})
}

// Random stores and forgets against a model: the cache holds exactly the
// latest stored keys, at most max, less the forgotten ones.
func TestDenyCacheModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxKeys, keys = 8, 30
		c := funnel.NewDenyCache(maxKeys)
		set := new(funnel.RuleSet)
		deny := funnel.Result{Rule: "r", RetryAfter: time.Hour}
		var model []string // oldest first
		drop := func(k string) {
			for i, m := range model {
				if m == k {
					model = append(model[:i], model[i+1:]...)
					return
				}
			}
		}
		r := rand.New(rand.NewPCG(1, 2))
		for op := range 20_000 {
			k := "k" + strconv.Itoa(r.IntN(keys))
			if r.IntN(4) == 0 {
				c.Forget(k)
				drop(k)
			} else {
				c.Store(k, set, 1, time.Now(), c.Epoch(), deny)
				drop(k)
				if len(model) == maxKeys {
					model = model[1:]
				}
				model = append(model, k)
			}
			if err := c.Check(); err != nil {
				t.Fatalf("op %d: %v", op, err)
			}
			if c.Len() != len(model) {
				t.Fatalf("op %d: %d entries, model %d", op, c.Len(), len(model))
			}
			for _, m := range model {
				if _, ok := c.Lookup(m, set, 1); !ok {
					t.Fatalf("op %d: %s missing; model %v", op, m, model)
				}
			}
		}
	})
}

// End to end: distinct denied keys through a Limiter with a cache of 20
// keys: never more than 20 entries, and the latest 20 keys are answered
// from it.
func TestDenyCacheBoundedLimiter(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		const maxKeys, keys = 20, 100
		lim, cmds := cachedLimiter(t, b, maxKeys)
		rule := funnel.AtMost(1, time.Hour)
		for i := range keys {
			k := "k" + strconv.Itoa(i)
			counted(t, lim, cmds, k, 1, rule)
			if res, n := counted(t, lim, cmds, k, 1, rule); res.Allowed || n == 0 {
				t.Fatalf("key %d: %+v, %d commands; want denied by Redis", i, res, n)
			}
			if l := funnel.DenyCacheLen(lim); l > maxKeys {
				t.Fatalf("%d entries after %d keys", l, i+1)
			}
		}
		for i := keys - maxKeys; i < keys; i++ {
			if res, n := counted(t, lim, cmds, "k"+strconv.Itoa(i), 1, rule); res.Allowed || n != 0 {
				t.Fatalf("key %d: %+v, %d commands; want denied by the cache", i, res, n)
			}
		}
		if res, n := counted(t, lim, cmds, "k0", 1, rule); res.Allowed || n == 0 {
			t.Fatalf("key 0: %+v, %d commands; want denied by Redis (evicted)", res, n)
		}
	})
}

// Without WithDenyCache every denied call asks Redis.
func TestDenyCacheOffByDefault(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		client := b.Client(t)
		cmds := &testutil.CommandCounter{}
		client.AddHook(cmds)
		lim := mustLimiter(t, client, funnel.WithPrefix(b.Prefix))
		rule := funnel.AtMost(1, time.Hour)
		counted(t, lim, cmds, "k", 1, rule)
		for i := range 5 {
			if res, n := counted(t, lim, cmds, "k", 1, rule); res.Allowed || n == 0 {
				t.Fatalf("denied call %d: %+v, %d commands; want denied by Redis", i, res, n)
			}
		}
		if l := funnel.DenyCacheLen(lim); l != 0 {
			t.Fatalf("%d entries in no cache", l)
		}
	})
}

func TestWithDenyCacheInvalid(t *testing.T) {
	b := testutil.Mini(t)
	for _, n := range []int{0, -1, funnel.MaxDenyCache + 1} {
		if lim, err := funnel.New(b.Client(t), funnel.WithDenyCache(n)); !errors.Is(err, funnel.ErrInvalidOption) || lim != nil {
			t.Errorf("WithDenyCache(%d): New = %v, %v; want nil, ErrInvalidOption", n, lim, err)
		}
	}
	lim := mustLimiter(t, b.Client(t), funnel.WithDenyCache(funnel.MaxDenyCache))
	if _, err := lim.Allow(context.Background(), "k", funnel.AtMost(1, time.Hour)); err != nil {
		t.Errorf("WithDenyCache(MaxDenyCache): %v", err)
	}
}

// A hit allocates nothing: AllowN allocates no more for a cached denial
// than it did before the lookup.
func TestDenyCacheHitAllocs(t *testing.T) {
	c := funnel.NewDenyCache(10)
	set := new(funnel.RuleSet)
	c.Store("k", set, 1, time.Now(), c.Epoch(), funnel.Result{Rule: "r", RetryAfter: time.Hour})
	if a := testing.AllocsPerRun(100, func() {
		if _, ok := c.Lookup("k", set, 1); !ok {
			t.Fatal("miss")
		}
	}); a != 0 {
		t.Fatalf("%v allocations per hit", a)
	}
}

// A Limiter whose cache is off (nil: its callers check) keeps nothing and
// answers every denial from Redis, through Refund and Reset too.
func TestDenyCacheNil(t *testing.T) {
	b := testutil.Mini(t)
	client := b.Client(t)
	cmds := &testutil.CommandCounter{}
	client.AddHook(cmds)
	lim := mustLimiter(t, client, funnel.WithPrefix(b.Prefix))
	ctx := context.Background()
	rule := funnel.AtMost(1, time.Hour)
	counted(t, lim, cmds, "k", 1, rule)
	for i := 0; i < 2; i++ {
		if res, n := counted(t, lim, cmds, "k", 1, rule); res.Allowed || n == 0 {
			t.Fatalf("call %d: %+v, %d commands; want denied by Redis", i, res, n)
		}
	}
	if err := lim.Refund(ctx, "other", 1, rule); err != nil {
		t.Fatal(err)
	}
	if err := lim.Reset(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	if l := funnel.DenyCacheLen(lim); l != 0 {
		t.Fatalf("a cache that is off holds %d entries", l)
	}
}

// On the real clock the wait counts from when the call was sent, and an
// entry past its gate time is a miss.
func TestDenyCacheSent(t *testing.T) {
	c := funnel.NewDenyCache(10)
	set := new(funnel.RuleSet)
	deny := funnel.Result{Rule: "r", RetryAfter: time.Minute, ResetAfter: 2 * time.Minute}
	c.Store("k", set, 1, time.Now().Add(-59*time.Second), c.Epoch(), deny)
	res, ok := c.Lookup("k", set, 1)
	if !ok || res.RetryAfter <= 0 || res.RetryAfter > time.Second || res.ResetAfter <= time.Minute || res.ResetAfter > time.Minute+time.Second {
		t.Fatalf("Lookup = %+v, %v; want about 1s and 1m1s left", res, ok)
	}
	c.Store("k", set, 1, time.Now().Add(-time.Minute), c.Epoch(), deny)
	if res, ok := c.Lookup("k", set, 1); ok {
		t.Fatalf("an entry at its gate time hit: %+v", res)
	}
	// Admissions are not stored.
	c.Store("a", set, 1, time.Now(), c.Epoch(), funnel.Result{Allowed: true})
	if _, ok := c.Lookup("a", set, 1); ok {
		t.Fatal("an admission was cached")
	}
}

// Lookups, stores and forgets from many goroutines (run with -race): the
// bound holds, and no stale denial outlives a forget that came after its
// epoch.
func TestDenyCacheConcurrent(t *testing.T) {
	t.Run("direct", func(t *testing.T) {
		const maxKeys = 50
		c := funnel.NewDenyCache(maxKeys)
		sets := []*funnel.RuleSet{new(funnel.RuleSet), new(funnel.RuleSet)}
		deny := funnel.Result{Rule: "r", RetryAfter: time.Hour, ResetAfter: time.Hour}
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(g), 1))
				for range 5000 {
					key := "k" + strconv.Itoa(r.IntN(200))
					set := sets[r.IntN(2)]
					switch r.IntN(10) {
					case 0:
						c.Forget(key)
					case 1, 2, 3:
						c.Store(key, set, r.Int64N(3)+1, time.Now(), c.Epoch(), deny)
					default:
						if res, ok := c.Lookup(key, set, r.Int64N(3)+1); ok && (res.Allowed || res.Rule != "r" || res.RetryAfter <= 0) {
							t.Errorf("Lookup = %+v", res)
						}
					}
					if l := c.Len(); l > maxKeys {
						t.Errorf("%d entries", l)
					}
				}
			})
		}
		wg.Wait()
		if err := c.Check(); err != nil {
			t.Fatal(err)
		}
		// A forget with no store after it leaves nothing to find.
		for i := range 200 {
			c.Forget("k" + strconv.Itoa(i))
		}
		if l := c.Len(); l != 0 {
			t.Fatalf("%d entries after forgetting every key", l)
		}
		if err := c.Check(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("limiter", func(t *testing.T) {
		b := testutil.Mini(t)
		lim, _ := cachedLimiter(t, b, 8)
		rule := funnel.AtMost(2, time.Hour)
		ctx := context.Background()
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				for i := range 200 {
					key := "k" + strconv.Itoa((g+i)%12)
					var err error
					switch i % 20 {
					case 0:
						err = lim.Refund(ctx, key, 1, rule)
					case 1:
						if g == 0 {
							err = lim.Reset(ctx, key)
						}
					default:
						_, err = lim.Allow(ctx, key, rule)
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if l := funnel.DenyCacheLen(lim); l > 8 {
			t.Fatalf("%d entries", l)
		}
	})
}

// BenchmarkDeniedCached is BenchmarkAllow's denied-parallel with the deny
// cache: a flooded key is denied in-process; cmds/op is the Redis commands
// per call (the first denial, and one per gate time).
func BenchmarkDeniedCached(b *testing.B) {
	for _, rs := range []struct {
		name  string
		rules []funnel.Rule
	}{{"1rule", benchOne}, {"3rules", benchThree}} {
		b.Run("denied-parallel-"+rs.name, func(b *testing.B) {
			be, c := benchBackend(b)
			cmds := &testutil.CommandCounter{}
			c.AddHook(cmds)
			lim := mustLimiter(b, c, funnel.WithPrefix(be.Prefix), funnel.WithDenyCache(1024))
			floodAndDeny(b, lim, rs.rules, func() { cmds.N.Store(0) })
			b.ReportMetric(float64(cmds.N.Load())/float64(b.N), "cmds/op")
		})
	}
}

// Lookups, which take no lock, racing stores, forgets and evictions on the
// same keys: a hit is always the key's own denial (each names its key in
// Rule), and the structure holds after.
func TestDenyCacheLookupsRaceWrites(t *testing.T) {
	const maxKeys, keys, ops = 8, 24, 20_000
	c := funnel.NewDenyCache(maxKeys)
	set := new(funnel.RuleSet)
	key := func(r *rand.Rand) string { return "k" + strconv.Itoa(r.IntN(keys)) }
	var wg sync.WaitGroup
	var hits atomic.Int64
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range ops {
				k := key(r)
				if r.IntN(4) == 0 {
					c.Forget(k)
				} else {
					c.Store(k, set, 1, time.Now(), c.Epoch(), funnel.Result{Rule: k, RetryAfter: time.Hour})
				}
			}
		})
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 2))
			for range ops {
				k := key(r)
				if res, ok := c.Lookup(k, set, 1); ok {
					hits.Add(1)
					if res.Rule != k {
						t.Errorf("Lookup(%q) answered %q's denial", k, res.Rule)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	if hits.Load() == 0 {
		t.Fatal("no lookup hit: the race proves nothing")
	}
}
