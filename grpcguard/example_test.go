package grpcguard_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/grpcguard"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// exampleServer serves grpc's health service (standing in for yours) with
// opts on 127.0.0.1, and returns a client of it and a function that stops
// both.
func exampleServer(opts ...grpc.ServerOption) (healthpb.HealthClient, func()) {
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	cc, _ := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	return healthpb.NewHealthClient(cc), func() { _ = cc.Close(); srv.Stop() }
}

// A guard of one call a minute per API key on a server's unary calls and
// streams: the second call is ResourceExhausted, with retry-after metadata
// (and a RetryInfo detail of the exact wait).
func Example() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()

	g, _ := guard.New(client, guard.WithPrefix("api:"), guard.WithRules(funnel.AtMost(1, time.Minute)))
	ic, err := grpcguard.New(g, grpcguard.WithKey(grpcguard.Metadata("x-api-key")))
	if err != nil {
		panic(err)
	}
	hc, stop := exampleServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
	defer stop()

	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1")
	for range 2 {
		var md metadata.MD
		res, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		fmt.Println(res.GetStatus(), status.Code(err), md.Get(grpcguard.RetryAfterKey))
	}
	// Another key's stream is decided once, when it opens.
	wctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k2"))
	defer cancel()
	for range 2 {
		w, _ := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
		res, err := w.Recv()
		fmt.Println("watch:", res.GetStatus(), status.Code(err))
	}
	// Output:
	// SERVING OK []
	// UNKNOWN ResourceExhausted [60]
	// watch: SERVING OK
	// watch: UNKNOWN ResourceExhausted
}

// A handler (or an interceptor after the guard's) reads the Decision that
// admitted its call.
func ExampleFromContext() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()

	g, _ := guard.New(client, guard.WithRules(funnel.Window(3, time.Hour)))
	report := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if d, ok := grpcguard.FromContext(ctx); ok {
			fmt.Println("admitted,", d.Remaining, "left")
		}
		return h(ctx, req)
	}
	hc, stop := exampleServer(grpc.ChainUnaryInterceptor(grpcguard.UnaryServerInterceptor(g), report))
	defer stop()
	for range 2 {
		_, _ = hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
	}
	// Output:
	// admitted, 2 left
	// admitted, 1 left
}

// Limiter puts a Guard behind go-grpc-middleware's ratelimit interceptors.
func ExampleLimiter() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()

	g, _ := guard.New(client, guard.WithRules(funnel.AtMost(1, time.Minute)))
	lim := grpcguard.Limiter(g, grpcguard.FullMethod())
	hc, stop := exampleServer(grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(lim)))
	defer stop()
	for range 2 {
		_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
		fmt.Println(status.Code(err))
	}
	// Output:
	// OK
	// ResourceExhausted
}
