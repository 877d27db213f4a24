package guard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// traceID is the context key of the value traceRecorder's hook puts in
// the decision's context.
type traceID struct{}

// A traceRecorder is a WithTrace that numbers each decision, puts its
// number in the context it returns, and records the end of each; and a
// go-redis hook that records, for each command, the number its context
// carries (0 for none).
type traceRecorder struct {
	t    *testing.T
	mu   sync.Mutex
	keys []string            // the key of each Trace call
	ends map[int][]endRecord // the ends of each decision, by number
	cmds []int               // each command's decision number
	obs  []guard.Observation // as WithObserve saw them
}

type endRecord struct {
	o    guard.Observation
	cmds int // commands sent when end was called
}

func (r *traceRecorder) trace(ctx context.Context, key string) (context.Context, func(guard.Observation)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, key)
	id := len(r.keys)
	return context.WithValue(ctx, traceID{}, id), func(o guard.Observation) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.ends[id] = append(r.ends[id], endRecord{o: o, cmds: len(r.cmds)})
	}
}

func (r *traceRecorder) observe(o guard.Observation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.obs = append(r.obs, o)
}

func (r *traceRecorder) record(ctx context.Context, n int) {
	id, _ := ctx.Value(traceID{}).(int)
	r.mu.Lock()
	defer r.mu.Unlock()
	for range n {
		r.cmds = append(r.cmds, id)
	}
}

func (r *traceRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *traceRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.record(ctx, 1)
		return next(ctx, cmd)
	}
}

func (r *traceRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.record(ctx, len(cmds))
		return next(ctx, cmds)
	}
}

// sent is how many commands the client has sent.
func (r *traceRecorder) sent() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.cmds)
}

// checkDecision fails the test unless the call whose commands began at
// from made decision number id (and no other one began), for key, whose
// end was called once, with the Observation Observe got, before the
// command numbered until (the first of fn's or the handler's, or the end
// of the call): every command from from to until carries the decision's
// context, none after it does.
func (r *traceRecorder) checkDecision(name string, id int, key string, from, until int, want func(guard.Observation) bool) {
	t := r.t
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.keys) != id || r.keys[id-1] != key {
		t.Errorf("%s: Trace called with %q; want decision %d for %q", name, r.keys, id, key)
		return
	}
	ends := r.ends[id]
	if len(ends) != 1 {
		t.Errorf("%s: end called %d times; want once", name, len(ends))
		return
	}
	e := ends[0]
	if !want(e.o) {
		t.Errorf("%s: end got %+v", name, e.o)
	}
	if last := r.obs[len(r.obs)-1]; last != e.o {
		t.Errorf("%s: end got %+v, Observe %+v", name, e.o, last)
	}
	if e.cmds > until {
		t.Errorf("%s: end called after %d commands, once the call had run (%d)", name, e.cmds, until)
	}
	if until <= from {
		t.Errorf("%s: no command in the decision", name)
	}
	for i, c := range r.cmds[from:] {
		switch in := from+i < until; {
		case in && c != id:
			t.Errorf("%s: command %d of the decision ran in decision %d's context; want %d", name, from+i, c, id)
		case !in && c != 0:
			t.Errorf("%s: command %d, after the decision, ran in decision %d's context", name, from+i, c)
		}
	}
}

// WithTrace is called once per decision, whatever the entry point
// (Allow, AllowN, Do, Enter, Middleware), before its first command: the
// context it returns is the one every command of the decision runs in,
// the wait for the InFlight permit included; its end gets the Observation
// Observe gets, once, before fn or the handler runs. fn, the handler and
// Call.Context() run in the caller's context, and so does the release of
// the permit. A nil ctx calls no Trace.
func TestTraceHookPerDecision(t *testing.T) {
	b := testutil.Mini(t)
	r := &traceRecorder{t: t, ends: map[int][]endRecord{}}
	client := b.Client(t)
	client.AddHook(r)
	g, err := guard.New(client,
		guard.WithPrefix(b.Prefix+"trace:"),
		guard.WithRules(funnel.AtMost(100, time.Hour)),
		guard.WithInFlight(2),
		guard.WithTimeout(10*time.Second),
		guard.WithTrace(r.trace),
		guard.WithObserve(r.observe),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	untraced := func(name string, ctx context.Context) {
		if ctx.Value(traceID{}) != nil {
			t.Errorf("%s runs in the decision's context", name)
		}
	}
	admitted := func(n int64, permit bool) func(guard.Observation) bool {
		return func(o guard.Observation) bool {
			return o.Decision.Allowed && o.Err == nil && o.N == n && o.Permit == permit && o.Latency > 0
		}
	}

	from := r.sent()
	if d, err := g.Allow(ctx, "allow"); err != nil || !d.Allowed {
		t.Fatalf("Allow: %+v, %v", d, err)
	}
	r.checkDecision("Allow", 1, "allow", from, r.sent(), admitted(1, false))

	from = r.sent()
	if d, err := g.AllowN(ctx, "allown", 3); err != nil || !d.Allowed {
		t.Fatalf("AllowN: %+v, %v", d, err)
	}
	r.checkDecision("AllowN", 2, "allown", from, r.sent(), admitted(3, false))

	from = r.sent()
	var fnAt int
	if d, err := g.Do(ctx, "do", func(ctx context.Context) error {
		fnAt = r.sent()
		untraced("Do's fn", ctx)
		return nil
	}); err != nil || !d.Allowed {
		t.Fatalf("Do: %+v, %v", d, err)
	}
	r.checkDecision("Do", 3, "do", from, fnAt, admitted(1, true))

	from = r.sent()
	c, err := g.Enter(ctx, "enter", 2)
	if err != nil || !c.Admitted() {
		t.Fatalf("Enter: %+v, %v", c, err)
	}
	untraced("Enter's Call.Context()", c.Context())
	entered := r.sent()
	c.Done()
	r.checkDecision("Enter", 4, "enter", from, entered, admitted(2, true))

	var handlerAt int
	h := g.Middleware(guard.Header("X-Key"))(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		handlerAt = r.sent()
		untraced("Middleware's handler", req.Context())
		w.WriteHeader(http.StatusNoContent)
	}))
	from = r.sent()
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	req.Header.Set("X-Key", "middleware")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusNoContent {
		t.Fatalf("Middleware: %d %s", rec.Code, rec.Body)
	}
	r.checkDecision("Middleware", 5, "middleware", from, handlerAt, admitted(1, true))

	// A denial and a failed call end their decision too.
	from = r.sent()
	if d, err := g.AllowN(ctx, "allown", 100); err != nil || d.Allowed {
		t.Fatalf("AllowN(100): %+v, %v; want a denial", d, err)
	}
	r.checkDecision("denied AllowN", 6, "allown", from, r.sent(), func(o guard.Observation) bool {
		return !o.Decision.Allowed && o.Err == nil && o.Decision.Rule != ""
	})

	var nilCtx context.Context
	if _, err := g.Allow(nilCtx, "nil"); !errors.Is(err, guard.ErrNilContext) {
		t.Fatalf("Allow(nil): %v; want ErrNilContext", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.keys) != 6 {
		t.Errorf("Trace called for a nil ctx: keys %q", r.keys)
	}
}
