package grpcguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/guard"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Every error of the guard maps to a code and a fixed text: the error's own
// text, which may name Redis or a key, never reaches the client.
func TestFailedTellsNothing(t *testing.T) {
	secret := errors.New("dial tcp 10.9.8.7:6379: key {k:+8613800138000}")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		ctx  context.Context
		err  error
		code codes.Code
	}{
		{context.Background(), fmt.Errorf("%w: %w", guard.ErrInvalidKey, secret), codes.InvalidArgument},
		{context.Background(), fmt.Errorf("%w: %w", guard.ErrBusy, fmt.Errorf("%w: %w", guard.ErrUnavailable, secret)), codes.Unavailable},
		{context.Background(), fmt.Errorf("%w: %w", guard.ErrUnavailable, secret), codes.Unavailable},
		{context.Background(), fmt.Errorf("%w: %w", guard.ErrRejected, secret), codes.Unavailable},
		{cancelled, fmt.Errorf("%w: %w", context.Canceled, secret), codes.Canceled},
		{context.Background(), secret, codes.Internal},
	}
	for _, c := range cases {
		st := status.Convert(failed(c.ctx, guard.Decision{}, c.err))
		if st.Code() != c.code {
			t.Errorf("%v: code %v; want %v", c.err, st.Code(), c.code)
		}
		if msg := st.Message(); msg == "" || msg == c.err.Error() || containsAny(msg, "dial", "10.9.8.7", "8613800138000", "guard:") {
			t.Errorf("%v: message %q tells the error", c.err, msg)
		}
	}
	st := status.Convert(keyFailed(secret))
	if st.Code() != codes.InvalidArgument || st.Message() != "invalid request key" {
		t.Errorf("a key function's own error: %v %q; want InvalidArgument with the fixed text", st.Code(), st.Message())
	}
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
