package grpcguard

import (
	"context"
	"fmt"

	"github.com/funnelguard/funnelguard/guard"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// An Interceptor guards the calls of a gRPC server with a guard.Guard: it
// decides each unary call, and each stream once when it opens, before the
// handler runs. It is safe for concurrent use; build it once with New. The
// zero Interceptor has no Guard: it ends every call with codes.Internal.
type Interceptor struct {
	g *guard.Guard
	c config
}

// New returns an Interceptor that guards calls with g, configured by
// opts. A nil g, a nil option or an option given a nil function is an
// error matching ErrInvalidConfig.
func New(g *guard.Guard, opts ...Option) (*Interceptor, error) {
	if g == nil {
		return nil, fmt.Errorf("%w: nil guard", ErrInvalidConfig)
	}
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Interceptor{g: g, c: c}, nil
}

// UnaryServerInterceptor is shorthand for New(g, opts...) and its Unary
// interceptor. It does not panic on a bad argument: the interceptor then
// ends every call with codes.Internal, without calling the handler. Call
// New to learn the error at setup.
func UnaryServerInterceptor(g *guard.Guard, opts ...Option) grpc.UnaryServerInterceptor {
	ic, err := New(g, opts...)
	if err != nil {
		ic = &Interceptor{} // refuses every call; New's error is the server's to see
	}
	return ic.Unary()
}

// StreamServerInterceptor is shorthand for New(g, opts...) and its Stream
// interceptor, and, like UnaryServerInterceptor, ends every call with
// codes.Internal if an argument is bad.
func StreamServerInterceptor(g *guard.Guard, opts ...Option) grpc.StreamServerInterceptor {
	ic, err := New(g, opts...)
	if err != nil {
		ic = &Interceptor{}
	}
	return ic.Stream()
}

// Unary returns the interceptor of unary calls. A call that WithSkip skips
// goes to the handler undecided. Otherwise it is keyed, costed (WithCost)
// and decided with guard.Guard.Enter, as guard.Guard.Middleware decides a
// request: admitted (under WithShadow, denied calls too), it goes to the
// handler with the Decision in its context (FromContext), holding its
// WithInFlight permit until the handler returns (its context is
// cancelled if the permit is lost); refused, it ends with the status of
// the package's table (see the package documentation) and the handler
// does not run. Nothing is refunded when the handler fails, as Middleware
// refunds nothing: a failed attempt counts.
func (ic *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if ic.skip(ctx, info.FullMethod) {
			return handler(ctx, req)
		}
		call, err := ic.admit(ctx, info.FullMethod, func() (int64, error) { return ic.unaryCost(ctx, info.FullMethod, req) })
		if err != nil {
			return nil, err
		}
		defer call.Done()
		return handler(newContext(call), req)
	}
}

// Stream returns the interceptor of streams. A stream is decided once, when
// it opens and before its handler reads a message, as Unary decides a call
// (WithStreamCost instead of WithCost); the handler's stream has the
// Decision in its context, and holds the stream's WithInFlight permit
// for the stream's whole life, until the handler returns. A refused stream
// ends before the handler runs, with the status of the package's table:
// the client sees it at its first receive.
func (ic *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		if ic.skip(ctx, info.FullMethod) {
			return handler(srv, ss)
		}
		call, err := ic.admit(ctx, info.FullMethod, func() (int64, error) { return ic.streamCost(ctx, info.FullMethod) })
		if err != nil {
			return err
		}
		defer call.Done()
		return handler(srv, &decidedStream{ServerStream: ss, ctx: newContext(call)})
	}
}

// admit decides the call of method in ctx at the cost cost returns, with
// guard.Guard.Enter. It returns the admitted Call, for the handler to run
// in and to end with Done, or the status error the call ends with.
func (ic *Interceptor) admit(ctx context.Context, method string, cost func() (int64, error)) (guard.Call, error) {
	if ic.g == nil {
		return guard.Call{}, status.Error(codes.Internal, "grpcguard: misconfigured interceptor")
	}
	key, err := ic.c.key(ctx, method)
	if err != nil {
		return guard.Call{}, keyFailed(err)
	}
	n, err := cost()
	if err != nil || n < 1 {
		return guard.Call{}, status.Error(codes.InvalidArgument, "invalid request cost")
	}
	call, err := ic.g.Enter(ctx, key, n)
	switch {
	case err != nil: // ErrBusy's Decision is the denial that stands for it: ErrorRetryAfter
		return guard.Call{}, failed(ctx, call.Decision, err)
	case !call.Admitted(): // by the rules, or, while Redis cannot answer, FailOpen's or the Fallback's
		return guard.Call{}, ic.denied(ctx, method, call.Decision)
	}
	return call, nil
}

// denied is the status error of the denial d: the denied handler's, or the
// default if it has none.
func (ic *Interceptor) denied(ctx context.Context, method string, d guard.Decision) error {
	if err := ic.c.denied(ctx, method, d); err != nil {
		return err
	}
	return deniedStatus(ctx, method, d)
}

func (ic *Interceptor) skip(ctx context.Context, method string) bool {
	return ic.c.skip != nil && ic.c.skip(ctx, method)
}

func (ic *Interceptor) unaryCost(ctx context.Context, method string, req any) (int64, error) {
	if ic.c.cost == nil {
		return 1, nil
	}
	return ic.c.cost(ctx, method, req)
}

func (ic *Interceptor) streamCost(ctx context.Context, method string) (int64, error) {
	if ic.c.streamCost == nil {
		return 1, nil
	}
	return ic.c.streamCost(ctx, method)
}

// decidedStream is a server stream whose context carries the Decision.
type decidedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *decidedStream) Context() context.Context { return s.ctx }

// decisionKey is the context key of the Decision.
type decisionKey struct{}

// newContext is the context of the handler of call: call.Context() with
// call's Decision for FromContext.
func newContext(call guard.Call) context.Context {
	return context.WithValue(call.Context(), decisionKey{}, call.Decision)
}

// FromContext returns the Decision an Interceptor made for the call whose
// context ctx is (the handler's ctx, or its stream's Context());
// false when it made none (a skipped call, or no interceptor).
func FromContext(ctx context.Context) (guard.Decision, bool) {
	d, ok := ctx.Value(decisionKey{}).(guard.Decision)
	return d, ok
}
