package ctxcall_test

import (
	"context"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/redis/go-redis/v9"
)

// Direct: a ctx that cannot end, on any client; on a client that honours
// deadlines, a ctx that only its deadline ends (DeadlineOnly of a parent
// that cannot end); never a ctx that can be cancelled sooner (go-redis
// watches no cancellation), nor a deadline on a client that ignores it.
func TestDirect(t *testing.T) {
	mk := func(on bool) ctxcall.Runner {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: on}) // never dialled
		t.Cleanup(func() { c.Close() })
		return ctxcall.NewRunner(c)
	}
	honours, ignores := mk(true), mk(false)
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	timeout, cancel2 := context.WithTimeout(context.Background(), time.Hour)
	defer cancel2()
	timed, cancel3 := ctxcall.DeadlineOnly(context.Background(), time.Now().Add(time.Hour))
	defer cancel3()
	timedChild, cancel4 := ctxcall.DeadlineOnly(cancellable, time.Now().Add(time.Hour))
	defer cancel4()
	for _, c := range []struct {
		name    string
		ctx     context.Context
		honours bool // Direct on a client that honours deadlines
		ignores bool // on one that does not
	}{
		{"Background", context.Background(), true, true},
		{"WithCancel", cancellable, false, false},
		{"WithTimeout", timeout, false, false},
		{"DeadlineOnly of Background", timed, true, false},
		{"DeadlineOnly of a cancellable ctx", timedChild, false, false},
	} {
		if got := honours.Direct(c.ctx); got != c.honours {
			t.Errorf("%s, client with ContextTimeoutEnabled: Direct = %v, want %v", c.name, got, c.honours)
		}
		if got := ignores.Direct(c.ctx); got != c.ignores {
			t.Errorf("%s, client without: Direct = %v, want %v", c.name, got, c.ignores)
		}
		if (honours.Workers(c.ctx) == nil) != c.honours {
			t.Errorf("%s: Workers is nil %v, want %v (nil exactly when Direct)", c.name, honours.Workers(c.ctx) == nil, c.honours)
		}
	}
	// The marked ctx is still a deadline's ctx: it ends at its deadline and
	// when cancelled.
	d, cancel5 := ctxcall.DeadlineOnly(context.Background(), time.Now().Add(time.Millisecond))
	defer cancel5()
	select {
	case <-d.Done():
	case <-time.After(time.Minute):
		t.Fatal("DeadlineOnly's ctx did not end at its deadline")
	}
	cancel3()
	if timed.Err() == nil {
		t.Fatal("DeadlineOnly's ctx did not end when cancelled")
	}
}
