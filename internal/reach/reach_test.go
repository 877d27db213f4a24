package reach_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// The errors go-redis really returns: a refused dial and a closed client
// are unreachable; a command cut short by its deadline is not.
func TestGoRedisErrors(t *testing.T) {
	r := testutil.NewRefused(t, 0)
	c := r.Client(t)
	err := c.Ping(context.Background()).Err()
	if !reach.Unreachable(err) {
		t.Errorf("PING to a port nobody listens on: %v; want unreachable", err)
	}
	c.Close()
	if err := c.Ping(context.Background()).Err(); !reach.Unreachable(err) {
		t.Errorf("PING on a closed client: %v; want unreachable", err)
	}

	// A listener that never accepts: the dial completes in the kernel and
	// the command waits for a reply that never comes, past its deadline.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hung := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer hung.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := hung.Ping(ctx).Err(); err == nil || reach.Unreachable(err) {
		t.Errorf("PING to a server that does not answer: %v; want an error that is not unreachable", err)
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassify(t *testing.T) {
	dial := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"refused", dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)), true},
		{"no route to host", dial(os.NewSyscallError("connect", syscall.EHOSTUNREACH)), true},
		{"network unreachable, wrapped by a custom dialer", fmt.Errorf("proxy: %w", syscall.ENETUNREACH), true},
		{"name not found", dial(&net.DNSError{Err: "no such host", Name: "redis.invalid", IsNotFound: true}), true},
		{"client closed", fmt.Errorf("mutex: acquire %q: %w", "x", redis.ErrClosed), true},
		{"dial timed out", dial(timeoutErr{}), false},
		{"dial cut by its context", dial(context.DeadlineExceeded), false},
		{"deadline", context.DeadlineExceeded, false},
		{"refused, then the deadline", errors.Join(syscall.ECONNREFUSED, context.DeadlineExceeded), false},
		{"connection lost with a command on it", io.EOF, false},
		{"reset", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, false},
		{"a reply of Redis", redis.ErrPoolTimeout, false},
	}
	for _, c := range cases {
		if got := reach.Unreachable(c.err); got != c.want {
			t.Errorf("%s (%v): Unreachable = %v, want %v", c.name, c.err, got, c.want)
		}
		m := reach.Mark(c.err)
		if got := errors.Is(m, reach.ErrUnreachable); got != c.want {
			t.Errorf("%s: Mark matches ErrUnreachable: %v, want %v", c.name, got, c.want)
		}
		if c.err != nil && (m.Error() != c.err.Error() || !errors.Is(m, c.err)) {
			t.Errorf("%s: Mark = %q, want the cause's message and the cause in its chain", c.name, m)
		}
	}
	m := reach.Mark(dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)))
	if reach.Mark(m) != m {
		t.Errorf("Mark of a marked error wrapped it again")
	}
}
