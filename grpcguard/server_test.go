package grpcguard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/grpcguard"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{}) // go-redis logs every refused dial of the Redis-down tests
	code := m.Run()
	if code == 0 {
		// go-redis's and grpc's background goroutines end a moment after
		// their Close: goleak retries for a while before it reports them.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// A backend is a miniredis and a go-redis client on it, closed when the
// test ends.
type backend struct {
	m      *miniredis.Miniredis
	client *redis.Client
}

func newBackend(t *testing.T) backend {
	t.Helper()
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	return backend{m: m, client: client}
}

// observed is the last Decision a guard made, as WithObserve saw it.
type observed struct {
	mu sync.Mutex
	d  guard.Decision
	n  int
}

func (o *observed) observe(ob guard.Observation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.d, o.n = ob.Decision, o.n+1
}

func (o *observed) last() (guard.Decision, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.d, o.n
}

// newGuard is a guard on b with opts (under a prefix of the test's name
// unless they set one), whose decisions o observes.
func newGuard(t *testing.T, b backend, opts []guard.Option, o *observed) *guard.Guard {
	t.Helper()
	opts = append([]guard.Option{guard.WithPrefix("grpcguard:" + t.Name() + ":")}, opts...)
	if o != nil {
		opts = append(opts, guard.WithObserve(o.observe))
	}
	g, err := guard.New(b.client, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// perHour is the options of n calls in any hour.
func perHour(n int64) []guard.Option {
	return []guard.Option{guard.WithRules(funnel.Window(n, time.Hour))}
}

// echo is the test service: its unary methods Say and Ping, and its
// streams Chat and Hold, answer with the Decision in their context
// (describe).
type echo struct {
	calls atomic.Int64 // handler runs
}

// describe is what a handler answers: the Decision it finds, if any.
func describe(ctx context.Context) string {
	d, ok := grpcguard.FromContext(ctx)
	if !ok {
		return "no decision"
	}
	return fmt.Sprintf("allowed=%v remaining=%d", d.Allowed, d.Remaining)
}

func (e *echo) unary(method string) grpc.MethodDesc {
	full := "/test.Echo/" + method
	return grpc.MethodDesc{MethodName: method, Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, _ any) (any, error) {
			e.calls.Add(1)
			return wrapperspb.String(describe(ctx)), nil
		}
		if ic == nil {
			return h(ctx, in)
		}
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
	}}
}

// chat answers the stream's first message with describe, then ends.
func (e *echo) chat(_ any, ss grpc.ServerStream) error {
	e.calls.Add(1)
	in := new(wrapperspb.StringValue)
	if err := ss.RecvMsg(in); err != nil {
		return err
	}
	return ss.SendMsg(wrapperspb.String(describe(ss.Context())))
}

// hold answers each message of the stream with describe until the client
// closes its side: a stream that lives as long as the client wants.
func (e *echo) hold(_ any, ss grpc.ServerStream) error {
	e.calls.Add(1)
	for {
		if err := ss.RecvMsg(new(wrapperspb.StringValue)); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := ss.SendMsg(wrapperspb.String(describe(ss.Context()))); err != nil {
			return err
		}
	}
}

func (e *echo) desc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "test.Echo",
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{e.unary("Say"), e.unary("Ping")},
		Streams: []grpc.StreamDesc{
			{StreamName: "Chat", Handler: e.chat, ServerStreams: true, ClientStreams: true},
			{StreamName: "Hold", Handler: e.hold, ServerStreams: true, ClientStreams: true},
		},
	}
}

// serve starts a gRPC server with opts on 127.0.0.1, and returns its
// service and a client connection to it; both stop when the test ends.
func serve(t *testing.T, opts ...grpc.ServerOption) (*echo, *grpc.ClientConn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(e.desc(), e)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		srv.Stop()
		<-done
	})
	return e, cc
}

// guarded starts a server guarded by g with opts, unary calls and
// streams alike.
func guarded(t *testing.T, g *guard.Guard, opts ...grpcguard.Option) (*echo, *grpc.ClientConn) {
	t.Helper()
	ic, err := grpcguard.New(g, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
}

// A reply is what a call got: the handler's answer, the status, and the
// header and trailer metadata.
type reply struct {
	value   string
	st      *status.Status
	header  metadata.MD
	trailer metadata.MD
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// call makes the unary call method (Say, Ping) with the request value v
// and the outgoing metadata md (name, value, ...).
func call(t *testing.T, cc *grpc.ClientConn, method, v string, md ...string) reply {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(testContext(t), md...)
	var r reply
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, "/test.Echo/"+method, wrapperspb.String(v), out, grpc.Header(&r.header), grpc.Trailer(&r.trailer))
	r.value, r.st = out.GetValue(), status.Convert(err)
	return r
}

// chat opens a Chat stream with the outgoing metadata md, sends one
// message and reads the answer.
func chat(t *testing.T, cc *grpc.ClientConn, md ...string) reply {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(testContext(t), md...)
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/test.Echo/Chat")
	if err != nil {
		return reply{st: status.Convert(err)}
	}
	_ = s.SendMsg(wrapperspb.String("hi")) // a refused stream may already be closed: RecvMsg says so
	_ = s.CloseSend()
	out := new(wrapperspb.StringValue)
	err = s.RecvMsg(out)
	if err == nil {
		err = s.RecvMsg(new(wrapperspb.StringValue)) // the end of the stream, for its status
	}
	var r reply
	r.header, _ = s.Header()
	r.trailer = s.Trailer()
	r.value = out.GetValue()
	if !errors.Is(err, io.EOF) {
		r.st = status.Convert(err)
	} else {
		r.st = status.New(codes.OK, "")
	}
	return r
}

// wantCode fails the test unless r ended with code.
func (r reply) wantCode(t *testing.T, code codes.Code) {
	t.Helper()
	if r.st.Code() != code {
		t.Fatalf("status %v %q; want %v", r.st.Code(), r.st.Message(), code)
	}
}

// wantAdmitted fails the test unless r is an admission whose handler saw
// the decision with remaining units left.
func (r reply) wantAdmitted(t *testing.T, remaining int64) {
	t.Helper()
	r.wantCode(t, codes.OK)
	if want := "allowed=true remaining=" + strconv.FormatInt(remaining, 10); r.value != want {
		t.Fatalf("handler saw %q; want %q", r.value, want)
	}
}

// wantRetry fails the test unless r carries a RetryInfo of wait and
// retry-after header and trailer metadata of its whole seconds.
func (r reply) wantRetry(t *testing.T, wait time.Duration) {
	t.Helper()
	var infos []*errdetails.RetryInfo
	for _, d := range r.st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			infos = append(infos, ri)
		}
	}
	if len(infos) != 1 || infos[0].GetRetryDelay().AsDuration() != wait {
		t.Fatalf("RetryInfo %v; want one with retry_delay %v", infos, wait)
	}
	secs := strconv.FormatInt(guard.RetryAfterSeconds(wait), 10)
	if got := r.header.Get(grpcguard.RetryAfterKey); len(got) != 1 || got[0] != secs {
		t.Fatalf("header retry-after %q; want [%s]", got, secs)
	}
	if got := r.trailer.Get(grpcguard.RetryAfterKey); len(got) != 1 || got[0] != secs {
		t.Fatalf("trailer retry-after %q; want [%s]", got, secs)
	}
}
