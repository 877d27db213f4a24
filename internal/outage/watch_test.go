package outage_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// A fake server: each dial refuses, connects or hangs until its context
// ends, as mode says, and is counted.
type fake struct {
	mode  atomic.Int32
	dials atomic.Int64
}

const (
	refuse int32 = iota
	connect
	hang
)

func refusal() error {
	return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
}

func (f *fake) dial(ctx context.Context) (net.Conn, error) {
	f.dials.Add(1)
	switch f.mode.Load() {
	case connect:
		a, b := net.Pipe()
		b.Close()
		return a, nil
	case hang:
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
	}
	return nil, refusal()
}

// long is a bound no call of these tests reaches unless the Watch fails to
// end it.
const long = 10 * time.Second

// wait runs a call that waits for its context to end and returns what the
// call saw and what Run returned.
func wait(w *outage.Watch) (seen, err error) {
	err = w.Run(context.Background(), long, func(ctx context.Context) error {
		<-ctx.Done()
		seen = ctx.Err()
		return seen
	})
	return seen, err
}

// A call's refused dial makes the Watch down: the next calls end with the
// refusal without running, until a probe connects; then they run again.
func TestRefusalEndsTheNextCalls(t *testing.T) {
	f := &fake{}
	w := outage.New(f.dial, long)
	err := w.Run(context.Background(), long, func(context.Context) error { return refusal() })
	if !reach.Unreachable(err) || !w.Down() {
		t.Fatalf("Run with a refused dial: %v, down %v; want the refusal and the Watch down", err, w.Down())
	}
	for range 3 {
		ran := false
		err := w.Run(context.Background(), long, func(context.Context) error { ran = true; return nil })
		if ran || !errors.Is(err, reach.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Run while down: ran %v, %v; want the refusal without running", ran, err)
		}
	}
	f.mode.Store(connect)
	ran := 0
	for i := 0; ran == 0; i++ { // a probe is due Retry after the last
		if i == 1000 {
			t.Fatalf("no call ran in %d tries after the server came back (%d dials)", i, f.dials.Load())
		}
		_ = w.Run(context.Background(), long, func(context.Context) error { ran++; return nil })
		time.Sleep(time.Millisecond)
	}
	if w.Down() {
		t.Errorf("the Watch stayed down after a probe connected")
	}
}

// A running call is cancelled when a probe is refused, and ends with the
// refusal, not with its context's error.
func TestRefusalCutsARunningCall(t *testing.T) {
	f := &fake{}
	w := outage.New(f.dial, long)
	seen, err := wait(w)
	if !errors.Is(seen, context.Canceled) || !errors.Is(err, reach.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("call while the server refuses: saw %v, Run returned %v; want it cancelled, ending with the refusal", seen, err)
	}
	if !w.Down() {
		t.Errorf("the Watch is not down after a refused probe")
	}
}

// A probe that connects or times out is no refusal: the call runs to its
// own end (a hung server costs the deadline).
func TestNoRefusalNoCut(t *testing.T) {
	for _, mode := range []int32{connect, hang} {
		f := &fake{}
		f.mode.Store(mode)
		w := outage.New(f.dial, 2*outage.Every)
		var seen error
		err := w.Run(context.Background(), 8*outage.Every, func(ctx context.Context) error {
			<-ctx.Done()
			seen = ctx.Err()
			return seen
		})
		if !errors.Is(seen, context.DeadlineExceeded) || errors.Is(err, reach.ErrUnreachable) || w.Down() {
			t.Errorf("mode %d: saw %v, Run returned %v, down %v; want the call's deadline and the Watch up", mode, seen, err, w.Down())
		}
		if f.dials.Load() == 0 {
			t.Errorf("mode %d: no probe while the call ran", mode)
		}
	}
}

// A caller's own end is its error, even if the server refused meanwhile.
func TestCallerEndIsItsOwn(t *testing.T) {
	f := &fake{}
	w := outage.New(f.dial, long)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := w.Run(ctx, long, func(ctx context.Context) error { return ctx.Err() })
	if !errors.Is(err, context.Canceled) || errors.Is(err, reach.ErrUnreachable) {
		t.Fatalf("Run with a cancelled ctx: %v; want ctx's error", err)
	}
}

// A closed client is no outage of the server: it does not make the Watch
// down (guard rejects its calls itself).
func TestClosedClientIsNoOutage(t *testing.T) {
	w := outage.New((&fake{}).dial, long)
	err := w.Run(context.Background(), long, func(context.Context) error { return redis.ErrClosed })
	if !errors.Is(err, redis.ErrClosed) || w.Down() {
		t.Fatalf("Run on a closed client: %v, down %v; want ErrClosed and the Watch up", err, w.Down())
	}
}

// A nil Watch only bounds the call.
func TestNilWatch(t *testing.T) {
	var w *outage.Watch
	err := w.Run(context.Background(), time.Millisecond, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) || w.Down() {
		t.Fatalf("nil Watch: %v; want the bound's deadline", err)
	}
}

// For probes with the client's own dialer, and watches only *redis.Client.
func TestFor(t *testing.T) {
	f := &fake{}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", Dialer: func(ctx context.Context, _, _ string) (net.Conn, error) { return f.dial(ctx) }})
	defer c.Close()
	w := outage.For(c, long)
	if _, err := wait(w); !errors.Is(err, reach.ErrUnreachable) || f.dials.Load() == 0 {
		t.Fatalf("Watch of a client with its own dialer: %v after %d dials; want the dialer's refusal", err, f.dials.Load())
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	if outage.For(cc, long) != nil {
		t.Errorf("For(cluster client) is not nil")
	}
}
