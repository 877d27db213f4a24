package reliability

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// The detour after an outage (internal/outage, guard/detour.go) goes to a
// client without the user's hooks, so it must carry only calls that the
// user's client refused without sending them (its dial breaker): right
// after a restart that did not trip the breaker (one caller), every call's
// commands go through the user's client, and its hooks see them. (With the
// detour taking every call for 1.1 s after the outage, the hook saw none of
// the calls made in that time.)
func TestDetourKeepsHooks(t *testing.T) {
	srv := testutil.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	var seen atomic.Int64
	c.AddHook(countHook{&seen})
	g, err := guard.New(c,
		guard.WithPrefix(testutil.NewPrefix()),
		guard.WithRules(funnel.Rule{Name: "busy", Capacity: 1 << 40, Leak: 1 << 40, Per: time.Second}),
		guard.WithTimeout(500*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := g.Allow(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	refused := false
	for range 20 { // a refusal makes the watch down
		if _, err := g.Allow(ctx, "k"); errors.Is(err, guard.ErrUnavailable) {
			refused = true
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !refused {
		t.Fatal("no call was refused while the server was down")
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	calls := 0
	for time.Since(back) < 500*time.Millisecond { // within the detour's 1.1 s
		before := seen.Load()
		_, err := g.Allow(ctx, "k")
		if err != nil {
			continue // the watch's probe has not found the server back yet
		}
		calls++
		if seen.Load() == before {
			t.Fatalf("call %d, %v after the restart: admitted, but the client's hook saw no command", calls, time.Since(back).Round(time.Millisecond))
		}
	}
	if calls == 0 {
		t.Fatal("no call admitted in the 500 ms after the restart")
	}
}

// countHook counts the commands its client processes, alone or pipelined.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
