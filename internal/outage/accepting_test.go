package outage_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/outage"
)

// Accepting waits while dials are refused, dialling again every Retry, and
// returns nil at the first dial that is not a refusal; a context that ends
// first is its error.
func TestAccepting(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	var dials atomic.Int32
	refuseTwice := func(ctx context.Context) (net.Conn, error) {
		if dials.Add(1) <= 2 {
			return nil, refused
		}
		a, b := net.Pipe()
		_ = b.Close()
		return a, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := outage.Accepting(ctx, refuseTwice); err != nil || dials.Load() != 3 {
		t.Fatalf("Accepting = %v after %d dials; want nil after the third", err, dials.Load())
	}
	// A time-out is no refusal: the server may be hung, not gone.
	timeout := func(ctx context.Context) (net.Conn, error) { return nil, context.DeadlineExceeded }
	if err := outage.Accepting(ctx, timeout); err != nil {
		t.Fatalf("Accepting after a dial that timed out = %v; want nil", err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 3*outage.Retry)
	defer cancelShort()
	always := func(ctx context.Context) (net.Conn, error) { return nil, refused }
	if err := outage.Accepting(short, always); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accepting while every dial is refused = %v; want its context's end", err)
	}
}
