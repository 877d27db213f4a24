package testutil

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Refused is a Redis address where nothing listens: every dial to it is
// refused, after Delay. With Delay 0 a refusal comes at once, as with a
// stopped server; a Delay stands for the time go-redis spends on a refused
// command with its default options (it dials again, DialerRetries times, and
// retries the command, MaxRetries times), but counted once per dial, so
// that a test can tell one refusal from several made in turn.
type Refused struct {
	Addr  string
	Delay time.Duration
	dials atomic.Int64
	held  atomic.Pointer[chan struct{}] // dials wait for it to close (HoldDials)
}

// NewRefused returns a Refused on a loopback port that t holds until it
// ends (reservePort), so that no other process can listen on it meanwhile.
func NewRefused(t testing.TB, delay time.Duration) *Refused {
	t.Helper()
	return &Refused{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(reservePort(t))), Delay: delay}
}

// reservePort binds a TCP socket to a free loopback port and never listens
// on it, until t ends: a dial to the port is refused (nothing listens), and
// no other socket can bind it (this one has no SO_REUSEADDR). A port only
// found free could be taken meanwhile: CI, running test processes side by
// side, once saw an HTTP server of another test answer a Refused address.
func reservePort(t testing.TB) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}

// HoldDials makes the dials from now on wait (after Delay) until release
// is called, so that a test can queue calls behind them; release also runs
// when t ends.
func (r *Refused) HoldDials(t testing.TB) (release func()) {
	ch := make(chan struct{})
	r.held.Store(&ch)
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return release
}

// Dials returns how many dials were made so far.
func (r *Refused) Dials() int64 { return r.dials.Load() }

// Client returns a client of the address that t closes when it ends: one
// dial per refused command (DialerRetries 1, no command retries), deadlines
// honoured, and a pool large enough that go-redis's dial circuit breaker,
// which opens after PoolSize failed dials and probes once a second from a
// goroutine of its own, stays shut.
func (r *Refused) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr: r.Addr, Dialer: r.dial, DialerRetries: 1, MaxRetries: -1,
		ContextTimeoutEnabled: true, PoolSize: 4096, PipelinePoolSize: 4096,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// dial waits Delay (or until ctx ends), then dials the address.
func (r *Refused) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	r.dials.Add(1)
	t := time.NewTimer(r.Delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if held := r.held.Load(); held != nil {
		select {
		case <-*held:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// ClientOpts returns a client of the address with the options o (nil: go-redis's
// defaults) but for its address and dialer, which dials as Client's does:
// with go-redis's defaults, a refused command dials again and is retried,
// each dial waiting Delay. t closes it when it ends.
func (r *Refused) ClientOpts(t testing.TB, o *redis.Options) *redis.Client {
	opts := redis.Options{}
	if o != nil {
		opts = *o
	}
	opts.Addr, opts.Dialer = r.Addr, r.dial
	c := redis.NewClient(&opts)
	t.Cleanup(func() { c.Close() })
	return c
}
