package outage_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// down makes w down: a call refused.
func down(t *testing.T, w *outage.Watch) {
	t.Helper()
	if err := w.Run(context.Background(), long, func(context.Context) error { return refusal() }); !reach.Unreachable(err) || !w.Down() {
		t.Fatalf("Run with a refused dial: %v, down %v; want the Watch down", err, w.Down())
	}
}

// While the server refused, a probe that times out (a starved process's
// dial that ran out of its time before it ran, or a host that now drops
// SYNs) does not end the outage: the call that waited for it is refused, and
// the Watch stays down. Only a dial that connects lets calls run again.
// (Before: a time-out made the Watch up, and 64 callers then went to
// go-redis, whose failed dials opened its breaker.)
func TestTimeoutEndsNoOutage(t *testing.T) {
	f := &fake{}
	w := outage.New(f.dial, 2*outage.Retry)
	down(t, w)
	f.mode.Store(hang)
	time.Sleep(outage.Retry) // the next call probes
	ran := false
	err := w.Run(context.Background(), long, func(context.Context) error { ran = true; return nil })
	if ran || !errors.Is(err, reach.ErrUnreachable) || !w.Down() {
		t.Fatalf("a call whose probe timed out: ran %v, %v, down %v; want it refused and the Watch still down", ran, err, w.Down())
	}
	if f.dials.Load() == 0 {
		t.Fatalf("%d dials: the call made no probe", f.dials.Load())
	}
}

// A detour begins when a probe finds the server back from refusing, and
// lasts Detour; none before any outage.
func TestDetour(t *testing.T) {
	f := &fake{}
	w := outage.New(f.dial, long)
	if w.Detouring() {
		t.Fatal("detouring before any outage")
	}
	down(t, w)
	if w.Detouring() {
		t.Fatal("detouring while down")
	}
	f.mode.Store(connect)
	time.Sleep(outage.Retry)
	if err := w.Run(context.Background(), long, func(context.Context) error { return nil }); err != nil || w.Down() {
		t.Fatalf("a call after the server came back: %v, down %v", err, w.Down())
	}
	if !w.Detouring() {
		t.Fatal("not detouring right after the server came back")
	}
	time.Sleep(outage.Detour)
	if w.Detouring() {
		t.Fatalf("still detouring %v after the server came back", outage.Detour)
	}
	var nilWatch *outage.Watch
	if nilWatch.Detouring() || nilWatch.Spare() != nil {
		t.Fatal("a nil Watch detours")
	}
}

// Spare is one client of the watched client's server and dialer, made
// once; a Watch of New has none.
func TestSpare(t *testing.T) {
	f := &fake{}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", Dialer: func(ctx context.Context, _, _ string) (net.Conn, error) { return f.dial(ctx) }, MinIdleConns: 3})
	defer c.Close()
	w := outage.For(c, long)
	s := w.Spare()
	if s == nil || s == c || w.Spare() != s {
		t.Fatalf("Spare = %p (client %p), then %p; want one client of its own", s, c, w.Spare())
	}
	defer s.Close()
	if o := s.Options(); o.Addr != c.Options().Addr || o.MinIdleConns != 0 {
		t.Fatalf("Spare's options: Addr %q, MinIdleConns %d; want the client's address and no idle connections of its own", o.Addr, o.MinIdleConns)
	}
	before := f.dials.Load()
	_ = s.Ping(context.Background()).Err()
	if f.dials.Load() == before {
		t.Fatal("Spare does not dial with the client's dialer")
	}
	if outage.New(f.dial, long).Spare() != nil {
		t.Fatal("a Watch of New has a Spare")
	}
}
