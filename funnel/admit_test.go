package funnel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// countingLimiter returns a Limiter with opts whose commands are counted,
// with its scripts loaded first (so that a count is one EVALSHA per script).
func countingLimiter(t *testing.T, b *testutil.Backend, opts ...funnel.Option) (*funnel.Limiter, *testutil.CommandCounter) {
	t.Helper()
	c := b.Client(t)
	counter := &testutil.CommandCounter{}
	c.AddHook(counter)
	lim := mustLimiter(t, c, append([]funnel.Option{funnel.WithPrefix(b.Prefix)}, opts...)...)
	for range 2 { // a key with no state, then one with state: every script
		if _, err := lim.Allow(context.Background(), "warm-up", funnel.AtMost(2, time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	counter.N.Store(0)
	return lim, counter
}

// A key none of whose rules has state, with its lock free, is admitted in
// one round trip (the gate writes the state), with the Result and the state
// that the two-round-trip path gives; the next call, on a key this Limiter
// wrote, is admitted in one round trip too (returning.lua); a Limiter that
// has not seen the key goes through the lock.
func TestAdmitOneRoundTrip(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		rules := []funnel.Rule{funnel.AtMost(5, time.Hour), {Name: "day", Capacity: 20, Leak: 3, Per: 24 * time.Hour}}
		fast, counter := countingLimiter(t, b)
		slow, _ := countingLimiter(t, b, funnel.WithUniformCost())

		got, err := fast.AllowN(ctx, "fast", 3, rules...)
		if err != nil || !got.Allowed {
			t.Fatalf("AllowN on a key with no state = %+v, %v", got, err)
		}
		if n := counter.N.Load(); n != 1 {
			t.Fatalf("%d commands; want 1", n)
		}
		want, err := slow.AllowN(ctx, "slow", 3, rules...)
		if err != nil || got != want {
			t.Fatalf("one round trip: %+v; through the lock: %+v, %v; want the same Result", got, want, err)
		}
		pf, err1 := fast.Peek(ctx, "fast", rules...)
		ps, err2 := slow.Peek(ctx, "slow", rules...)
		if err1 != nil || err2 != nil || pf.Remaining != ps.Remaining || pf.ResetAfter-ps.ResetAfter > time.Second || ps.ResetAfter-pf.ResetAfter > time.Second {
			t.Fatalf("Peek after: %+v, %v against %+v, %v; want the same state", pf, err1, ps, err2)
		}
		ttlFast := b.Client(t).PTTL(ctx, b.Prefix+"{fast}:f").Val()
		ttlSlow := b.Client(t).PTTL(ctx, b.Prefix+"{slow}:f").Val()
		if ttlFast <= 0 || ttlFast-ttlSlow > time.Second || ttlSlow-ttlFast > time.Second {
			t.Fatalf("TTL %v after one round trip, %v through the lock; want the same", ttlFast, ttlSlow)
		}
		counter.N.Store(0)
		if res, err := fast.Allow(ctx, "fast", rules...); err != nil || !res.Allowed || res.Remaining != 1 {
			t.Fatalf("the second call = %+v, %v; want admitted, 1 left", res, err)
		}
		if n := counter.N.Load(); n != 1 {
			t.Fatalf("%d commands for a key this Limiter wrote; want 1: the returning key's gate", n)
		}
		// Another Limiter (another process) has not seen the key: the
		// lock and the commit.
		other, counter := countingLimiter(t, b, funnel.WithStateCache(0))
		if res, err := other.Allow(ctx, "fast", rules...); err != nil || !res.Allowed || res.Remaining != 0 {
			t.Fatalf("the third call = %+v, %v; want admitted, 0 left", res, err)
		}
		if n := counter.N.Load(); n != 2 {
			t.Fatalf("%d commands for a key with state, unseen; want 2: the lock and the commit", n)
		}
	})
}

// WithUniformCost: a key with no state costs the two round trips of any
// other.
func TestAdmitUniformCost(t *testing.T) {
	b := testutil.Mini(t)
	lim, counter := countingLimiter(t, b, funnel.WithUniformCost())
	if res, err := lim.Allow(context.Background(), "k", funnel.AtMost(5, time.Hour)); err != nil || !res.Allowed {
		t.Fatalf("Allow = %+v, %v", res, err)
	}
	if n := counter.N.Load(); n != 2 {
		t.Fatalf("%d commands; want 2", n)
	}
}

// While another holds the key's lock (between its read and its write), a
// key with no state is not admitted by the gate: the call waits for the
// lock, and writes nothing before it has it.
func TestAdmitNotWhileLocked(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		rule := funnel.AtMost(5, time.Hour)
		lim, _ := countingLimiter(t, b)
		lk := waitsWhileHeld(t, b, lim, "held", rule)
		if n := b.Client(t).Exists(ctx, b.Prefix+"{held}:f").Val(); n != 0 {
			t.Fatal("state written while another held the key's lock")
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if res, err := lim.Allow(ctx, "held", rule); err != nil || !res.Allowed || res.Remaining != 4 {
			t.Fatalf("Allow once the lock is free = %+v, %v; want admitted, 4 left", res, err)
		}
	})
}

// The state of other rules of the key does not stop a call whose rules have
// none from being admitted at once, and its TTL, longer, is kept.
func TestAdmitOtherRulesState(t *testing.T) {
	b := testutil.Mini(t)
	ctx := context.Background()
	lim, counter := countingLimiter(t, b)
	long := funnel.Rule{Name: "long", Capacity: 3, Leak: 1, Per: 10 * time.Hour}
	if _, err := lim.Allow(ctx, "k", long); err != nil {
		t.Fatal(err)
	}
	before := b.Client(t).PTTL(ctx, b.Prefix+"{k}:f").Val()
	counter.N.Store(0)
	if res, err := lim.Allow(ctx, "k", funnel.AtMost(1, time.Minute)); err != nil || !res.Allowed {
		t.Fatalf("Allow with another rule = %+v, %v", res, err)
	}
	if n := counter.N.Load(); n != 1 {
		t.Fatalf("%d commands; want 1", n)
	}
	if after := b.Client(t).PTTL(ctx, b.Prefix+"{k}:f").Val(); after < before-time.Second {
		t.Fatalf("TTL %v after a one-minute rule's admission, was %v: the long rule's state would expire early", after, before)
	}
}

// waitsWhileHeld takes key's lock with another Locker and checks that an
// Allow of lim on key waits for it until its deadline (200 ms); it returns
// the lock, still held.
func waitsWhileHeld(t *testing.T, b *testutil.Backend, lim *funnel.Limiter, key string, rule funnel.Rule) *mutex.Lock {
	t.Helper()
	ctx := context.Background()
	other := mustLocker(t, b.Client(t), mutex.WithPrefix(b.Prefix))
	lk, err := other.TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if res, err := lim.Allow(short, key, rule); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Allow while the lock is held = %+v, %v; want it to wait until its deadline", res, err)
	}
	return lk
}
