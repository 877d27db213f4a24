package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// gatedProvider is a slow provider: each call holds until the test lets
// it go (a token from release, or open closed), counting the calls that
// run at once.
type gatedProvider struct {
	running, most, calls atomic.Int64
	in                   chan struct{} // one value per call that started
	release              chan struct{} // a token lets one call end
	open                 chan struct{} // closed: every call ends
}

func newGatedProvider() *gatedProvider {
	return &gatedProvider{in: make(chan struct{}, 100), release: make(chan struct{}), open: make(chan struct{})}
}

func (p *gatedProvider) Send(ctx context.Context, _, _ string) error {
	now := p.running.Add(1)
	for m := p.most.Load(); now > m && !p.most.CompareAndSwap(m, now); m = p.most.Load() {
	}
	p.calls.Add(1)
	p.in <- struct{}{}
	select {
	case <-p.release:
	case <-p.open:
	case <-ctx.Done():
	}
	p.running.Add(-1)
	return nil
}

// inFlightService serves a service on client with ProviderInFlight 2 and
// the wait given, sending through p.
func inFlightService(t *testing.T, client redis.UniversalClient, p Provider, wait time.Duration) *httptest.Server {
	t.Helper()
	cfg := testConfig()
	noIPLimits(&cfg)
	cfg.ProviderInFlight, cfg.ProviderInFlightWait = 2, wait
	svc, err := NewService(client, cfg, p, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return srv
}

// sent is the answer to one send: its status and Retry-After.
type sent struct {
	status int
	retry  string
	err    error
}

// sendTo posts a send to phone, from any goroutine.
func sendTo(srv *httptest.Server, phone string) sent {
	res, err := srv.Client().Post(srv.URL+"/api/sms/send", "application/json", strings.NewReader(`{"phone": "`+phone+`"}`))
	if err != nil {
		return sent{err: err}
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	return sent{status: res.StatusCode, retry: res.Header.Get("Retry-After")}
}

// sendAll starts a send to each of n numbers at once; their answers come
// on the channel.
func sendAll(srv *httptest.Server, n int) <-chan sent {
	out := make(chan sent, n)
	for i := range n {
		go func() { out <- sendTo(srv, phoneN(i)) }()
	}
	return out
}

// inFlightClients runs f on a miniredis and on a redis-server of its own
// (the service's keys have fixed names).
func inFlightClients(t *testing.T, f func(t *testing.T, c *redis.Client)) {
	t.Run("miniredis", func(t *testing.T) {
		b := testutil.Mini(t)
		b.Mini.SetTime(t0)
		f(t, b.ClientOpts(t, &redis.Options{PoolSize: 64}))
	})
	t.Run("redis", func(t *testing.T) {
		srv := testutil.StartServer(t)
		f(t, redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64}))
	})
}

// TestProviderInFlightBusy: 10 sends at once to a provider that holds its
// calls, at most 2 in flight: 2 calls run, the 8 other sends are answered
// 503 with Retry-After 1 once their wait ends, without a provider call,
// and refunded (each number gets its code at once after).
func TestProviderInFlightBusy(t *testing.T) {
	inFlightClients(t, func(t *testing.T, c *redis.Client) {
		defer c.Close()
		p := newGatedProvider()
		srv := inFlightService(t, c, p, 300*time.Millisecond)
		answers := sendAll(srv, 10)
		for i := range 8 {
			a := <-answers
			if a.err != nil || a.status != http.StatusServiceUnavailable || a.retry != "1" {
				t.Errorf("answer %d while 2 calls hold: %+v; want 503 with Retry-After 1", i, a)
			}
		}
		close(p.open)
		for range 2 {
			if a := <-answers; a.status != http.StatusAccepted {
				t.Errorf("a held send: %+v, want 202", a)
			}
		}
		if most, calls := p.most.Load(), p.calls.Load(); most != 2 || calls != 2 {
			t.Errorf("%d provider calls at once, %d in all; want 2 and 2", most, calls)
		}
		// The 2 numbers sent a code are in their cooldown; the 8 others were refunded.
		again := map[int]int{}
		for i := range 10 {
			again[sendTo(srv, phoneN(i)).status]++
		}
		if again[http.StatusAccepted] != 8 || again[http.StatusTooManyRequests] != 2 || p.calls.Load() != 10 {
			t.Errorf("sends again to the 10 numbers: %v, %d provider calls in all; want 8 202s, 2 429s, 10 calls", again, p.calls.Load())
		}
	})
}

// TestProviderInFlightServed: with a long enough wait, 10 sends at once are
// all served, 2 provider calls at a time: while 2 hold, the 8 others wait
// in the semaphore's queue in Redis; each call let go lets one more in.
func TestProviderInFlightServed(t *testing.T) {
	inFlightClients(t, func(t *testing.T, c *redis.Client) {
		defer c.Close()
		p := newGatedProvider()
		srv := inFlightService(t, c, p, time.Minute)
		answers := sendAll(srv, 10)
		<-p.in
		<-p.in
		waitProviderQueue(t, c, 8)
		if got := p.running.Load(); got != 2 {
			t.Errorf("%d provider calls running with 8 sends queued, want 2", got)
		}
		for range 10 {
			p.release <- struct{}{}
		}
		for range 10 {
			if a := <-answers; a.status != http.StatusAccepted {
				t.Errorf("send: %+v, want 202", a)
			}
		}
		if most, calls := p.most.Load(), p.calls.Load(); most != 2 || calls != 10 {
			t.Errorf("%d provider calls at once, %d in all; want 2 and 10", most, calls)
		}
	})
}

// waitProviderQueue waits until n sends wait for a provider permit.
func waitProviderQueue(t *testing.T, c *redis.Client, n int64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got, err := c.ZCard(context.Background(), "sms:inflight:{provider}:sem:queue").Result()
		if err == nil && got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sends wait for a provider permit, want %d (%v)", got, n, err)
		}
	}
}

// TestProviderInFlightConfig: a negative bound, or a bound without a wait,
// is refused; 0 turns the bound off.
func TestProviderInFlightConfig(t *testing.T) {
	for _, c := range []struct {
		n    int64
		wait time.Duration
		ok   bool
	}{{-1, time.Second, false}, {2, 0, false}, {0, 0, true}, {1, time.Millisecond, true}} {
		cfg := testConfig()
		cfg.ProviderInFlight, cfg.ProviderInFlightWait = c.n, c.wait
		if err := cfg.check(); (err == nil) != c.ok {
			t.Errorf("ProviderInFlight %d, wait %v: %v; want ok %v", c.n, c.wait, err, c.ok)
		}
	}
}
