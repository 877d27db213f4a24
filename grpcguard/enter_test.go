package grpcguard_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/grpcguard"
	"github.com/funnelguard/funnelguard/guard"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Under WithShadow a call over the limit reaches the handler, which
// sees the denying Decision; so does a stream.
func TestShadowLetsDeniedThrough(t *testing.T) {
	var o observed
	g := newGuard(t, newBackend(t), append(perHour(1), guard.WithShadow()), &o)
	e, cc := guarded(t, g)
	call(t, cc, "Say", "").wantAdmitted(t, 0)
	for _, r := range []reply{call(t, cc, "Say", ""), chat(t, cc)} {
		r.wantCode(t, codes.OK)
		if want := "allowed=false remaining=0"; r.value != want {
			t.Fatalf("handler saw %q; want %q, the denial", r.value, want)
		}
	}
	if d, n := o.last(); d.Allowed || n != 3 {
		t.Fatalf("guard's last decision %+v after %d; want the 3rd a denial", d, n)
	}
	if got := e.calls.Load(); got != 3 {
		t.Fatalf("handler ran %d times; want 3", got)
	}
}

// inFlightOne is the options of n calls an hour, one call of a key running at
// once; a call waits 2 s for the permit.
func inFlightOne(n int64) []guard.Option {
	return append(perHour(n), guard.WithInFlight(1), guard.WithTimeout(2*time.Second))
}

// With InFlight 1, while one unary call of the key runs in its handler, a
// second ends Unavailable with ErrorRetryAfter in RetryInfo and
// retry-after, without running; its unit is given back, and the permit
// comes back when the first call's handler returns.
func TestInFlightUnaryBusy(t *testing.T) {
	g := newGuard(t, newBackend(t), inFlightOne(3), nil)
	ic, err := grpcguard.New(g)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var n atomic.Int64
	block := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if n.Add(1) == 1 { // the first call holds on in its handler
			close(entered)
			<-release
		}
		return h(ctx, req)
	}
	e, cc := serve(t, grpc.ChainUnaryInterceptor(ic.Unary(), block))
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before the server stops, should the test end early
	first := make(chan reply, 1)
	go func() { first <- call(t, cc, "Say", "") }()
	select {
	case <-entered:
	case r := <-first:
		t.Fatalf("first call ended %v before its handler ran", r.st)
	}
	r := call(t, cc, "Say", "")
	letGo()
	r.wantCode(t, codes.Unavailable)
	if want := "too many requests in flight"; r.st.Message() != want {
		t.Fatalf("message %q; want %q", r.st.Message(), want)
	}
	r.wantRetry(t, guard.DefaultErrorRetry)
	(<-first).wantAdmitted(t, 2)
	call(t, cc, "Say", "").wantAdmitted(t, 1) // the busy call's unit came back; so did the permit
	if got := e.calls.Load(); got != 2 {
		t.Fatalf("handler ran %d times; want 2", got)
	}
}

// A hold is a Hold stream open on a connection.
type hold struct {
	s grpc.ClientStream
}

func openHold(t *testing.T, cc *grpc.ClientConn) hold {
	t.Helper()
	s, err := cc.NewStream(testContext(t), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/test.Echo/Hold")
	if err != nil {
		t.Fatal(err)
	}
	return hold{s}
}

// exchange sends a message and reads the answer, or the stream's end.
func (h hold) exchange() reply {
	_ = h.s.SendMsg(wrapperspb.String("hi")) // a refused stream may be closed: RecvMsg says so
	out := new(wrapperspb.StringValue)
	err := h.s.RecvMsg(out)
	r := reply{value: out.GetValue(), st: status.Convert(err)}
	if err != nil {
		r.header, _ = h.s.Header()
		r.trailer = h.s.Trailer()
	}
	return r
}

// end closes the client's side and reads the stream's status.
func (h hold) end() *status.Status {
	_ = h.s.CloseSend()
	if err := h.s.RecvMsg(new(wrapperspb.StringValue)); !errors.Is(err, io.EOF) {
		return status.Convert(err)
	}
	return status.New(codes.OK, "")
}

// A stream holds its InFlight permit for its whole life: while one that
// has already exchanged messages is open, another of the key is refused
// Unavailable; once it ends, the next is admitted.
func TestInFlightStreamHoldsPermit(t *testing.T) {
	g := newGuard(t, newBackend(t), inFlightOne(5), nil)
	e, cc := guarded(t, g)
	a := openHold(t, cc)
	a.exchange().wantAdmitted(t, 4)
	a.exchange().wantAdmitted(t, 4) // the Decision of the stream's opening
	r := openHold(t, cc).exchange()
	r.wantCode(t, codes.Unavailable)
	r.wantRetry(t, guard.DefaultErrorRetry)
	call(t, cc, "Say", "").wantCode(t, codes.Unavailable) // unary calls of the key too
	if st := a.end(); st.Code() != codes.OK {
		t.Fatalf("first stream ended %v", st)
	}
	c := openHold(t, cc)
	c.exchange().wantAdmitted(t, 3) // the refused calls' units came back
	if st := c.end(); st.Code() != codes.OK {
		t.Fatalf("last stream ended %v", st)
	}
	if got := e.calls.Load(); got != 2 {
		t.Fatalf("stream handler ran %d times; want 2", got)
	}
}

// While Redis cannot answer, a denial of FailOpen's in-process rules or of
// the Fallback is ResourceExhausted, as any denial, not Unavailable.
func TestDegradedDenialIsExhausted(t *testing.T) {
	rules := []funnel.Rule{funnel.Window(1, time.Hour)}
	for name, p := range map[string][]guard.Option{
		"FailOpen": {guard.WithRules(rules...), guard.WithOnError(guard.FailOpen)},
		"Fallback": {guard.WithRules(rules...), guard.WithFallback(guard.Fallback{Limit: 0.001, Burst: 1})},
	} {
		t.Run(name, func(t *testing.T) {
			b := newBackend(t)
			var o observed
			g := newGuard(t, b, p, &o)
			_, cc := guarded(t, g)
			b.m.SetError("LOADING Redis is loading the dataset in memory")
			call(t, cc, "Say", "").wantCode(t, codes.OK)
			r := call(t, cc, "Say", "")
			r.wantCode(t, codes.ResourceExhausted)
			d, _ := o.last()
			if d.Allowed || !d.Degraded {
				t.Fatalf("guard's decision %+v; want a degraded denial", d)
			}
			r.wantRetry(t, d.RetryAfter)
		})
	}
}
