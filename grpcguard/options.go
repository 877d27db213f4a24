package grpcguard

import (
	"context"
	"errors"
	"fmt"

	"github.com/funnelguard/funnelguard/guard"
)

// ErrInvalidConfig means a nil Guard, a nil Option, or an Option given a
// nil function: New returns it, and an interceptor built with it by
// UnaryServerInterceptor or StreamServerInterceptor answers every call with
// codes.Internal.
var ErrInvalidConfig = errors.New("grpcguard: invalid configuration")

// An Option configures the interceptors of New. Each checks its argument:
// a nil function is New's error, matching ErrInvalidConfig.
type Option func(*config) error

type config struct {
	key        KeyFunc
	cost       func(ctx context.Context, fullMethod string, req any) (int64, error)
	streamCost func(ctx context.Context, fullMethod string) (int64, error)
	skip       func(ctx context.Context, fullMethod string) bool
	denied     func(ctx context.Context, fullMethod string, d guard.Decision) error
}

// newConfig applies opts over the defaults: the peer's address as the key,
// a cost of 1, no call skipped, the default denial.
func newConfig(opts []Option) (config, error) {
	c := config{key: PeerAddr(guard.ClientIPConfig{}), denied: deniedStatus}
	for i, o := range opts {
		if o == nil {
			return config{}, fmt.Errorf("%w: option %d is nil", ErrInvalidConfig, i)
		}
		if err := o(&c); err != nil {
			return config{}, err
		}
	}
	return c, nil
}

// notNil is an Option's check of its function argument f, named what.
func notNil(isNil bool, what string) error {
	if isNil {
		return fmt.Errorf("%w: %s(nil)", ErrInvalidConfig, what)
	}
	return nil
}

// WithKey keys calls with key instead of the peer's address
// (PeerAddr(guard.ClientIPConfig{})).
func WithKey(key KeyFunc) Option {
	return func(c *config) error {
		c.key = key
		return notNil(key == nil, "WithKey")
	}
}

// WithCost charges each unary call the units cost returns for its request
// (the n of guard.Guard.Enter) instead of one. An error or a cost below 1
// ends the call with codes.InvalidArgument, and so does a cost over a
// rule's capacity, which no wait would admit.
func WithCost(cost func(ctx context.Context, fullMethod string, req any) (int64, error)) Option {
	return func(c *config) error {
		c.cost = cost
		return notNil(cost == nil, "WithCost")
	}
}

// WithStreamCost charges each stream the units cost returns when it opens,
// instead of one; its errors are answered as WithCost's. A stream is
// decided once, before its handler runs and before any message is read, so
// cost sees no request.
func WithStreamCost(cost func(ctx context.Context, fullMethod string) (int64, error)) Option {
	return func(c *config) error {
		c.streamCost = cost
		return notNil(cost == nil, "WithStreamCost")
	}
}

// WithSkip lets the calls for which skip returns true through without a
// decision (health checks, reflection, allow-listed clients): nothing is
// charged, and FromContext reports no Decision.
func WithSkip(skip func(ctx context.Context, fullMethod string) bool) Option {
	return func(c *config) error {
		c.skip = skip
		return notNil(skip == nil, "WithSkip")
	}
}

// WithDeniedHandler ends denied calls with the error h returns instead of
// the default: codes.ResourceExhausted with a google.rpc.RetryInfo detail
// and "retry-after" header and trailer metadata. h runs before the handler
// would, in the call's context, and may set metadata itself (grpc.SetHeader
// works on that context for unary calls and streams alike). An h that
// returns nil gets the default error: a denied call never reaches the
// handler.
func WithDeniedHandler(h func(ctx context.Context, fullMethod string, d guard.Decision) error) Option {
	return func(c *config) error {
		c.denied = h
		return notNil(h == nil, "WithDeniedHandler")
	}
}
