package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// countedGuard returns a Guard with opts on a fresh client of b that counts its
// commands.
func countedGuard(t *testing.T, b *testutil.Backend, opts ...guard.Option) (*guard.Guard, *testutil.CommandCounter) {
	t.Helper()
	client := b.Client(t)
	cmds := &testutil.CommandCounter{}
	client.AddHook(cmds)
	opts = append([]guard.Option{guard.WithRules(smsRules...)}, opts...)
	g, err := guard.New(client, append(opts, guard.WithPrefix(b.Prefix+"g:"), guard.WithTimeout(10*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	return g, cmds
}

// allowCounted calls g.Allow and returns its Decision and the commands it
// sent; it fails t on an error.
func allowCounted(t *testing.T, g *guard.Guard, cmds *testutil.CommandCounter, key string) (guard.Decision, int64) {
	t.Helper()
	before := cmds.N.Load()
	d, err := g.Allow(context.Background(), key)
	if err != nil {
		t.Fatalf("Allow(%q): %v", key, err)
	}
	return d, cmds.N.Load() - before
}

// With funnel.WithDenyCache, a denied key is answered through Guard.Allow with
// no Redis command, as a normal denial (not Degraded) counting down; a
// Refund through the Guard clears it.
func TestDenyCache(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		var observed []guard.Decision
		g, cmds := countedGuard(t, b,
			guard.WithFunnel(funnel.WithDenyCache(100)),
			guard.WithSecret([]byte("k")), // the cache keys on the stored key
			guard.WithObserve(func(o guard.Observation) { observed = append(observed, o.Decision) }),
		)
		const phone = "+8613800138000"
		if d, n := allowCounted(t, g, cmds, phone); !d.Allowed || n == 0 {
			t.Fatalf("first: %+v, %d commands", d, n)
		}
		first, n := allowCounted(t, g, cmds, phone)
		if first.Allowed || first.Rule != "cooldown" || n == 0 {
			t.Fatalf("second: %+v, %d commands; want denied by Redis", first, n)
		}
		for i := range 10 {
			d, n := allowCounted(t, g, cmds, phone)
			if n != 0 || d.Allowed || d.Degraded || d.Rule != first.Rule || d.Tightest != first.Tightest ||
				d.Remaining != first.Remaining || d.RetryAfter <= 0 || d.RetryAfter > first.RetryAfter {
				t.Fatalf("call %d: %+v, %d commands; want %+v from the cache", i, d, n, first)
			}
		}
		if last := observed[len(observed)-1]; last.Allowed || last.Degraded {
			t.Fatalf("observed %+v", last)
		}
		if d, n := allowCounted(t, g, cmds, "+8613800138001"); !d.Allowed || n == 0 {
			t.Fatalf("another number: %+v, %d commands", d, n)
		}
		if err := g.Refund(context.Background(), phone); err != nil {
			t.Fatal(err)
		}
		if d, n := allowCounted(t, g, cmds, phone); !d.Allowed || n == 0 {
			t.Fatalf("after the refund: %+v, %d commands; want admitted by Redis", d, n)
		}
	})
}

// Without funnel.WithDenyCache every denied call asks Redis.
func TestDenyCacheOff(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		g, cmds := countedGuard(t, b)
		allowCounted(t, g, cmds, "k")
		for i := range 3 {
			if d, n := allowCounted(t, g, cmds, "k"); d.Allowed || n == 0 {
				t.Fatalf("denied call %d: %+v, %d commands; want denied by Redis", i, d, n)
			}
		}
	})
}

// A cached denial is Redis's own decision, valid until its gate time: it is
// answered while Redis is down, without error and not Degraded, whatever
// OnError says; a key that is not cached gets the failure mode.
func TestDenyCacheRedisDown(t *testing.T) {
	b := testutil.Mini(t)
	g, cmds := countedGuard(t, b, guard.WithFunnel(funnel.WithDenyCache(10)), guard.WithOnError(guard.FailOpen))
	allowCounted(t, g, cmds, "k")
	if d, n := allowCounted(t, g, cmds, "k"); d.Allowed || n == 0 {
		t.Fatalf("second: %+v, %d commands", d, n)
	}
	b.Mini.Close()
	d, err := g.Allow(context.Background(), "k")
	if err != nil || d.Allowed || d.Degraded || d.Rule != "cooldown" {
		t.Fatalf("cached key with Redis down: %+v, %v; want its cached denial", d, err)
	}
	d, err = g.Allow(context.Background(), "other")
	if !errors.Is(err, guard.ErrUnavailable) || !d.Degraded {
		t.Fatalf("other key with Redis down: %+v, %v; want the failure mode", d, err)
	}
}

func TestDenyCacheInvalid(t *testing.T) {
	b := testutil.Mini(t)
	for _, n := range []int{-1, 0, funnel.MaxDenyCache + 1} {
		_, err := guard.New(b.Client(t), guard.WithRules(smsRules...), guard.WithFunnel(funnel.WithDenyCache(n)))
		if !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("WithDenyCache(%d): %v; want ErrInvalidOption", n, err)
		}
		if !errors.Is(err, funnel.ErrInvalidOption) {
			t.Errorf("WithDenyCache(%d): %v; want funnel.ErrInvalidOption", n, err)
		}
	}
	for _, n := range []int{1, funnel.MaxDenyCache} {
		if _, err := guard.New(b.Client(t), guard.WithRules(smsRules...), guard.WithFunnel(funnel.WithDenyCache(n))); err != nil {
			t.Errorf("WithDenyCache(%d): %v", n, err)
		}
	}
}
