package grpcguard

import (
	"context"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Limiter adapts g to the ratelimit.Limiter of go-grpc-middleware v2
// (interceptors/ratelimit), for servers that chain its interceptors: each
// call costs one unit of the key key derives (the peer's address if key is
// nil), with the method that grpc.Method finds in the call's context ("" on
// the client side).
//
// Limit decides with guard.Guard.Enter, as an Interceptor does, and
// returns nil when g admits the call (with FailOpen or a Fallback, also
// while Redis cannot answer; under WithShadow, denied calls too).
// Otherwise its error is the status error an Interceptor would end the
// call with, and sets the same retry-after metadata; but ratelimit's
// interceptors end every refused call with codes.ResourceExhausted and the
// error's text in the message, so the client sees neither that code nor
// the RetryInfo detail: use the Interceptor for those. The text is the
// status's message alone ("too many requests"), never the guard's error.
// With a nil g, every call is refused.
//
// A ratelimit.Limiter cannot change the call's context: the handler of a
// call it admits finds no Decision (FromContext reports false; use the
// Interceptor for it).
//
// A ratelimit.Limiter learns nothing of the call's end, so Limit gives a
// WithInFlight permit back as soon as it has it: it bounds no running
// calls (the Interceptor does), and costs two more round trips.
func Limiter(g *guard.Guard, key KeyFunc) ratelimit.Limiter {
	if key == nil {
		key = PeerAddr(guard.ClientIPConfig{})
	}
	c := config{key: key, denied: deniedStatus}
	return limiter{ic: &Interceptor{g: g, c: c}}
}

type limiter struct{ ic *Interceptor }

func (l limiter) Limit(ctx context.Context) error {
	method, _ := grpc.Method(ctx)
	call, err := l.ic.admit(ctx, method, func() (int64, error) { return 1, nil })
	if err != nil {
		return limitError{status.Convert(err)}
	}
	call.Done() // Limit learns nothing of the call's end: it holds no permit through it
	return nil
}

// limitError is a refusal of Limit: its text is the status's message alone,
// which ratelimit puts in its own status.
type limitError struct{ st *status.Status }

func (e limitError) Error() string { return e.st.Message() }

// GRPCStatus is the status an Interceptor would end the call with.
func (e limitError) GRPCStatus() *status.Status { return e.st }
