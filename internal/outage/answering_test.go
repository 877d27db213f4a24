package outage_test

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/outage"
)

var refused = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}

// server returns a dial whose connections are served by reply: it reads the
// PING and answers with reply, or, for "", reads it and never answers (a
// hung server, whose kernel accepted the connection).
func server(t *testing.T, reply string) outage.Dial {
	return func(ctx context.Context) (net.Conn, error) {
		client, srv := net.Pipe()
		go func() {
			defer srv.Close()
			buf := make([]byte, 64)
			if _, err := srv.Read(buf); err != nil {
				return
			}
			if reply == "" {
				_, _ = io.Copy(io.Discard, srv) // until the client closes
				return
			}
			_, _ = srv.Write([]byte(reply))
		}()
		return client, nil
	}
}

// Answering waits while dials are refused, trying again every Retry, and
// returns nil once a PING gets a reply, any reply.
func TestAnswering(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, reply := range []string{"+PONG\r\n", "-NOAUTH Authentication required.\r\n"} {
		var dials atomic.Int32
		up := server(t, reply)
		refuseTwice := func(ctx context.Context) (net.Conn, error) {
			if dials.Add(1) <= 2 {
				return nil, refused
			}
			return up(ctx)
		}
		if err := outage.Answering(ctx, refuseTwice); err != nil || dials.Load() != 3 {
			t.Fatalf("Answering = %v after %d dials; want nil after the third (reply %q)", err, dials.Load(), reply)
		}
	}
}

// A server that accepts and does not answer is waited for like one that
// refuses: a command sent to it would hang, and spend go-redis's dial
// retries if it were killed then. So is a dial that times out.
func TestAnsweringWaitsForAHungServer(t *testing.T) {
	timeout := func(ctx context.Context) (net.Conn, error) { return nil, context.DeadlineExceeded }
	for name, dial := range map[string]outage.Dial{"hung": server(t, ""), "dial time-out": timeout, "refused": func(context.Context) (net.Conn, error) { return nil, refused }} {
		var dials atomic.Int32
		counted := func(ctx context.Context) (net.Conn, error) { dials.Add(1); return dial(ctx) }
		ctx, cancel := context.WithTimeout(context.Background(), 2*outage.AnswerBound)
		err := outage.Answering(ctx, counted)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || dials.Load() < 2 {
			t.Errorf("%s: Answering = %v after %d dials; want its context's end, after 2 tries or more", name, err, dials.Load())
		}
	}
}

// A dial that fails otherwise (a certificate the client rejects) ends the
// wait at once: the client's own dial would fail the same way.
func TestAnsweringStopsAtOtherDialErrors(t *testing.T) {
	bad := func(context.Context) (net.Conn, error) { return nil, x509.UnknownAuthorityError{} }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := outage.Answering(ctx, bad); err != nil {
		t.Fatalf("Answering after a certificate error = %v; want nil", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Answering after a certificate error took %v; want at once", d)
	}
}
