package ctxcall_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// A call that outlives its context is left behind: Do returns at the
// context's end (before the call does: it is still blocked then), with an
// error matching both ErrAbandoned and ctx.Err(), and late gets the call's
// outcome once it comes.
func TestAbandoned(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	lateGot := make(chan int, 1)
	started := make(chan struct{})
	go func() { <-started; cancel() }()
	v, err := ctxcall.Do(ctx, ctxcall.NewWorkers(), func(context.Context) (int, error) {
		close(started)
		<-release // blocked until Do has returned
		return 42, nil
	}, func(v int, err error) { lateGot <- v })
	close(release)
	if v != 0 || !errors.Is(err, ctxcall.ErrAbandoned) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, %v; want 0 and ErrAbandoned joined with context.Canceled", v, err)
	}
	if got := <-lateGot; got != 42 {
		t.Fatalf("late got %d, want the call's 42", got)
	}
}

// A call that ends first is returned as it is, and late never runs.
func TestFinished(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	v, err := ctxcall.Do(ctx, ctxcall.NewWorkers(), func(context.Context) (string, error) { return "ok", nil }, func(string, error) {
		t.Error("late ran for a call whose caller got the outcome")
	})
	if v != "ok" || err != nil {
		t.Fatalf("Do = %q, %v", v, err)
	}
	// A client that honours deadlines, or a ctx that cannot end: called in
	// the caller's goroutine.
	for _, c := range []struct {
		ctx context.Context
		w   *ctxcall.Workers
	}{{ctx, nil}, {context.Background(), ctxcall.NewWorkers()}} {
		done := false
		v, err := ctxcall.Do(c.ctx, c.w, func(context.Context) (int, error) { done = true; return 1, nil }, nil)
		// Read without synchronisation: the race detector objects if f
		// ran in another goroutine.
		if v != 1 || err != nil || !done {
			t.Fatalf("Do(workers %v) = %v, %v", c.w != nil, v, err)
		}
	}
	// An ended ctx: nothing runs.
	cancel()
	if _, err := ctxcall.Do(ctx, ctxcall.NewWorkers(), func(context.Context) (int, error) { t.Error("ran with an ended ctx"); return 0, nil }, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with an ended ctx = %v", err)
	}
}

func TestHonours(t *testing.T) {
	mk := func(on bool) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: on}) // never dialled
		t.Cleanup(func() { c.Close() })
		return c
	}
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { cl.Close() })
	type wrapper struct{ redis.Scripter }
	noDeadline := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, ReadTimeout: -2})
	t.Cleanup(func() { noDeadline.Close() })
	cases := []struct {
		name   string
		client any
		want   bool
	}{
		{"default client", mk(false), false},
		{"ContextTimeoutEnabled", mk(true), true},
		{"cluster with ContextTimeoutEnabled", cl, true},
		{"a wrapper that hides the options", wrapper{mk(true)}, false},
		{"ContextTimeoutEnabled, ReadTimeout -2 (no socket deadline)", noDeadline, false},
		{"nil", nil, false},
	}
	for _, c := range cases {
		if got := ctxcall.Honours(c.client); got != c.want {
			t.Errorf("%s: Honours = %v, want %v", c.name, got, c.want)
		}
	}
}

// lateTimer's deadline has passed but its timer has not fired: Err is nil.
type lateTimer struct{ context.Context }

func (lateTimer) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// Ended: nil while ctx has time or no deadline; ctx's error once it ended;
// DeadlineExceeded once the deadline passed, before the timer says so.
func TestEnded(t *testing.T) {
	live, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	cancelled, stop := context.WithCancel(context.Background())
	stop()
	for _, c := range []struct {
		name string
		ctx  context.Context
		want error
	}{
		{"no deadline", context.Background(), nil},
		{"time left", live, nil},
		{"cancelled", cancelled, context.Canceled},
		{"deadline passed, timer not fired", lateTimer{context.Background()}, context.DeadlineExceeded},
	} {
		if got := ctxcall.Ended(c.ctx); !errors.Is(got, c.want) || (c.want == nil) != (got == nil) {
			t.Errorf("%s: Ended = %v, want %v", c.name, got, c.want)
		}
	}
}

// ioTimeout is a socket's time-out, as go-redis returns it when the
// context's deadline (its socket deadline) passes.
type ioTimeout struct{}

func (ioTimeout) Error() string { return "i/o timeout" }
func (ioTimeout) Timeout() bool { return true }

// A call that timed out at its context's deadline matches
// context.DeadlineExceeded even when ctx's timer has not fired yet (a
// loaded machine): the socket deadline go-redis set from it fired first.
// Another error, or a time-out before the deadline, is left alone.
func TestTimeoutAtDeadline(t *testing.T) {
	live, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	late := lateTimer{live} // Done is live's: not nil, never closed here
	for _, w := range []*ctxcall.Workers{nil, ctxcall.NewWorkers()} {
		for _, c := range []struct {
			name string
			ctx  context.Context
			err  error
			want bool
		}{
			{"a time-out past the deadline", late, ioTimeout{}, true},
			{"a time-out before the deadline", live, ioTimeout{}, false},
			{"another error past the deadline", late, errors.New("ERR"), false},
		} {
			_, err := ctxcall.Do(c.ctx, w, func(context.Context) (int, error) { return 0, c.err }, nil)
			if got := errors.Is(err, context.DeadlineExceeded); got != c.want || !errors.Is(err, c.err) {
				t.Errorf("workers %v, %s: %v; want DeadlineExceeded %v, wrapping %v", w != nil, c.name, err, c.want, c.err)
			}
		}
	}
}
