package grpcguard

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// RetryAfterKey is the metadata key, sent as header and trailer, of the
// whole seconds a refused call should wait (guard.RetryAfterSeconds: rounded
// up, at least 1), for clients and proxies that read no status details.
const RetryAfterKey = "retry-after"

// deniedStatus is the default answer to a denial: ResourceExhausted, with
// RetryInfo and retry-after metadata.
func deniedStatus(ctx context.Context, _ string, d guard.Decision) error {
	return retryable(ctx, codes.ResourceExhausted, "too many requests", d.RetryAfter)
}

// failed is the status error of a call that the guard refused (Enter's
// error err, with the denial d that stands for it), or ctx's error. Only
// fixed texts reach the client: err is for the server.
func failed(ctx context.Context, d guard.Decision, err error) error {
	switch {
	case errors.Is(err, guard.ErrInvalidKey):
		return status.Error(codes.InvalidArgument, "invalid request key")
	case errors.Is(err, funnel.ErrInvalidN): // a cost over a rule's capacity
		return status.Error(codes.InvalidArgument, "the request costs more than the limit allows")
	case errors.Is(err, guard.ErrBusy): // before ErrUnavailable, which a count in this process matches too
		return retryable(ctx, codes.Unavailable, "too many requests in flight", d.RetryAfter)
	case errors.Is(err, guard.ErrUnavailable), errors.Is(err, guard.ErrRejected):
		return retryable(ctx, codes.Unavailable, "rate limiter unavailable", d.RetryAfter)
	case errors.Is(err, guard.ErrPlan):
		return retryable(ctx, codes.Unavailable, "no plan for the request's key", d.RetryAfter)
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Error(codes.Internal, "rate limiter error")
}

// keyFailed is the status error of a key function's error err: what the
// client can fix, or Internal for a key function built wrong.
func keyFailed(err error) error {
	if errors.Is(err, guard.ErrInvalidKeyFunc) {
		return status.Error(codes.Internal, "grpcguard: invalid key function")
	}
	return status.Error(codes.InvalidArgument, fixOf(err, "invalid request key"))
}

// fixOf is the Fix of the RequestError in err's chain, or def.
func fixOf(err error, def string) string {
	if re, ok := errors.AsType[*guard.RequestError](err); ok && re.Fix != "" {
		return re.Fix
	}
	return def
}

// retryable is a status error of code with a RetryInfo of wait; it sets the
// call's retry-after header and trailer to wait in whole seconds.
func retryable(ctx context.Context, code codes.Code, msg string, wait time.Duration) error {
	setRetryAfter(ctx, wait)
	st, err := status.New(code, msg).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
	if err != nil { // a RetryInfo always marshals; keep the code anyway
		return status.Error(code, msg)
	}
	return st.Err()
}

// setRetryAfter sets the retry-after header and trailer of the call whose
// server context ctx is. A context of no server call (a Limiter on the
// client side) is left alone.
func setRetryAfter(ctx context.Context, wait time.Duration) {
	md := metadata.Pairs(RetryAfterKey, strconv.FormatInt(guard.RetryAfterSeconds(wait), 10))
	_ = grpc.SetHeader(ctx, md) // fails only outside a server call, or once headers are sent
	_ = grpc.SetTrailer(ctx, md)
}
