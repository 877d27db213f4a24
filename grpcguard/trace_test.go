package grpcguard_test

import (
	"context"
	"testing"

	"github.com/funnelguard/funnelguard/grpcguard"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// commandSpans is a go-redis hook that starts a span per command in the
// command's context, as redisotel's does (without its module).
type commandSpans struct{ tracer trace.Tracer }

func (h commandSpans) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h commandSpans) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		ctx, span := h.tracer.Start(ctx, "redis "+cmd.Name())
		defer span.End()
		return next(ctx, cmd)
	}
}

func (h commandSpans) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		ctx, span := h.tracer.Start(ctx, "redis pipeline")
		defer span.End()
		return next(ctx, cmds)
	}
}

// spanStream is a server stream in the context ctx.
type spanStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *spanStream) Context() context.Context { return s.ctx }

// With a WithTrace that starts a span (as otelguard.Tracer.Trace does),
// a unary call and a stream through the interceptors, on a real server on
// loopback, each have the guard's span under the request's (started by an
// interceptor before the guard's, as otelgrpc's stats handler starts it),
// with every Redis command of the decision under the guard's span; the
// handler's span is the request span's child, not the ended guard span's.
// A denied call has its guard span too, and no handler.
func TestInterceptorsDecideSpan(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("test")

	b := newBackend(t)
	b.client.AddHook(commandSpans{tracer})
	decide := func(ctx context.Context, _ string) (context.Context, func(guard.Observation)) {
		ctx, span := tracer.Start(ctx, "funnelguard.decide")
		return ctx, func(guard.Observation) { span.End() }
	}
	g := newGuard(t, b, append(perHour(2), guard.WithTrace(decide)), nil)
	ic, err := grpcguard.New(g)
	if err != nil {
		t.Fatal(err)
	}
	requestUnary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, span := tracer.Start(ctx, "request")
		defer span.End()
		return h(ctx, req)
	}
	handlerUnary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, span := tracer.Start(ctx, "handler")
		defer span.End()
		return h(ctx, req)
	}
	requestStream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, span := tracer.Start(ss.Context(), "request")
		defer span.End()
		return h(srv, &spanStream{ServerStream: ss, ctx: ctx})
	}
	handlerStream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, span := tracer.Start(ss.Context(), "handler")
		defer span.End()
		return h(srv, &spanStream{ServerStream: ss, ctx: ctx})
	}
	_, cc := serve(t, grpc.ChainUnaryInterceptor(requestUnary, ic.Unary(), handlerUnary),
		grpc.ChainStreamInterceptor(requestStream, ic.Stream(), handlerStream))

	call(t, cc, "Say", "hi").wantAdmitted(t, 1)
	chat(t, cc).wantAdmitted(t, 0)
	call(t, cc, "Say", "hi").wantCode(t, codes.ResourceExhausted)

	// The server ends its spans before it sends a call's status, which
	// the client has read: every span has ended.
	byTrace := map[trace.TraceID]map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		id := s.SpanContext().TraceID()
		if byTrace[id] == nil {
			byTrace[id] = map[string][]sdktrace.ReadOnlySpan{}
		}
		name := s.Name()
		if name != "request" && name != "handler" && name != "funnelguard.decide" {
			name = "redis"
		}
		byTrace[id][name] = append(byTrace[id][name], s)
	}
	if len(byTrace) != 3 {
		t.Fatalf("%d traces; want one per call, 3", len(byTrace))
	}
	handlers := 0
	for _, tr := range byTrace {
		reqs, decides := tr["request"], tr["funnelguard.decide"]
		if len(reqs) != 1 || len(decides) != 1 {
			t.Fatalf("a trace with %d request spans, %d guard spans; want 1 of each", len(reqs), len(decides))
		}
		req, decide := reqs[0].SpanContext().SpanID(), decides[0].SpanContext().SpanID()
		if decides[0].Parent().SpanID() != req {
			t.Errorf("guard span's parent %v; want the request's %v", decides[0].Parent().SpanID(), req)
		}
		if len(tr["redis"]) == 0 {
			t.Error("a call with no Redis command span in its trace")
		}
		// A connection's handshake (HELLO, CLIENT SETINFO) is the child of
		// the command that needed it.
		byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
		for _, s := range tr["redis"] {
			byID[s.SpanContext().SpanID()] = s
		}
		for _, s := range tr["redis"] {
			up := s
			for byID[up.Parent().SpanID()] != nil {
				up = byID[up.Parent().SpanID()]
			}
			if up.Parent().SpanID() != decide {
				t.Errorf("span %s: under %v; want the guard's span %v", s.Name(), up.Parent().SpanID(), decide)
			}
		}
		for _, s := range tr["handler"] {
			handlers++
			if s.Parent().SpanID() != req {
				t.Errorf("handler span's parent %v; want the request's %v, not the guard's %v", s.Parent().SpanID(), req, decide)
			}
		}
	}
	if handlers != 2 {
		t.Errorf("%d handler spans; want 2 (the unary call and the stream admitted)", handlers)
	}
}
