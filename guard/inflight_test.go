package guard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// plenty is a rule that admits every call of these tests.
var plenty = []funnel.Rule{funnel.AtMost(1000, time.Hour)}

// semQueueKey is the key of the FIFO queue of the InFlight semaphore of
// the plain key key under the guard prefix prefix (mutex/semaphore.lua's
// KEYS[3]: the semaphore is named after the stored key, "k:" and the key).
func semQueueKey(prefix, key string) string {
	return prefix + "{k:" + key + "}:sem:queue"
}

// waitQueued waits until n calls wait in the queue at qkey, and fails t if
// that never happens or running goes over most meanwhile.
func waitQueued(t *testing.T, rc *redis.Client, qkey string, n int64, running *atomic.Int64, most int64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if r := running.Load(); r > most {
			t.Fatalf("%d calls running at once, want at most %d", r, most)
		}
		got, err := rc.ZCard(context.Background(), qkey).Result()
		if err == nil && got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls wait for a permit, want %d (%v); %d running", got, n, err, running.Load())
		}
	}
}

// raise sets most to now if now is larger.
func raise(most *atomic.Int64, now int64) {
	for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
	}
}

// TestInFlightNeverMoreThanN: 32 goroutines call Do for one key through two
// guards, each with its own client and Locker, InFlight 3: while the
// handlers hold on, exactly 3 run and the 29 others wait in Redis; once
// they let go, every call runs, and never more than 3 at once.
func TestInFlightNeverMoreThanN(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		const n, callers = 3, 32
		ctx := context.Background()
		p := []guard.Option{guard.WithInFlight(n), guard.WithRules(plenty...), guard.WithTimeout(time.Minute)}
		gs := []*guard.Guard{newGuard(t, b, p...), newGuard(t, b, p...)}
		var running, most, served atomic.Int64
		release := make(chan struct{})
		var once sync.Once
		letGo := func() { once.Do(func() { close(release) }) }
		defer letGo()
		errs := make(chan error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				d, err := gs[i%2].Do(ctx, "k", func(context.Context) error {
					raise(&most, running.Add(1))
					<-release
					running.Add(-1)
					served.Add(1)
					return nil
				})
				if err != nil || !d.Allowed {
					errs <- fmt.Errorf("call %d: %+v, %v", i, d, err)
				}
			})
		}
		waitQueued(t, b.Client(t), semQueueKey(b.Prefix+"g:", "k"), callers-n, &running, n)
		if got := running.Load(); got != n {
			t.Errorf("%d calls running with %d queued, want %d", got, callers-n, n)
		}
		letGo()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if most.Load() != n || served.Load() != callers {
			t.Errorf("at most %d running at once, %d served; want %d and %d", most.Load(), served.Load(), n, callers)
		}
	})
}

// holdKey starts a Do of key on g whose fn holds until the returned release
// is called; it returns once fn runs. wait waits for that Do's end.
func holdKey(t *testing.T, g *guard.Guard, key string) (release func(), wait func() error) {
	t.Helper()
	in, out := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := g.Do(context.Background(), key, func(context.Context) error {
			close(in)
			<-out
			return nil
		})
		done <- err
	}()
	select {
	case <-in:
	case err := <-done:
		t.Fatalf("Do(%q) returned %v before its fn ran", key, err)
	}
	var once sync.Once
	release = func() { once.Do(func() { close(out) }) }
	t.Cleanup(release)
	return release, func() error { release(); return <-done }
}

// TestInFlightOtherKeys: a key whose one permit is held does not hold up
// another key.
func TestInFlightOtherKeys(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		g := newGuard(t, b, guard.WithInFlight(1), guard.WithRules(plenty...), guard.WithTimeout(5*time.Second))
		_, wait := holdKey(t, g, "a")
		ran := false
		d, err := g.Do(context.Background(), "b", func(context.Context) error { ran = true; return nil })
		if err != nil || !d.Allowed || !ran {
			t.Errorf("key b while a is busy: %+v, %v, ran %v; want it run", d, err, ran)
		}
		if err := wait(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestInFlightBusy: a call that finds the key's permits held through
// Timeout does not run, is refused with ErrBusy and ErrorRetryAfter, and
// gets its unit back (the rule of 3 admits 2 more calls after the held one
// and it, not 1).
func TestInFlightBusy(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		g := newGuard(t, b, guard.WithInFlight(1), guard.WithRules(funnel.AtMost(3, time.Hour)), guard.WithTimeout(2*time.Second))
		_, wait := holdKey(t, g, "k")
		d, err := g.Do(ctx, "k", func(context.Context) error {
			t.Error("fn ran while the key's permit was held")
			return nil
		})
		if !errors.Is(err, guard.ErrBusy) || d.Allowed || d.Degraded || d.RetryAfter != guard.DefaultErrorRetry {
			t.Errorf("busy call = %+v, %v; want a denial with ErrBusy and RetryAfter %v", d, err, guard.DefaultErrorRetry)
		}
		if err := wait(); err != nil {
			t.Fatal(err)
		}
		for i, want := range []bool{true, true, false} { // the busy call's unit came back: one more admission
			if d, err := g.Allow(ctx, "k"); err != nil || d.Allowed != want {
				t.Errorf("Allow %d after the busy call = %+v, %v; want allowed %v", i, d, err, want)
			}
		}
	})
}

// TestInFlightReleasedOnErrorAndPanic: fn's error and fn's panic both give
// the permit back (InFlight 1: the next call runs at once, not after the
// lease).
func TestInFlightReleasedOnErrorAndPanic(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		g := newGuard(t, b, guard.WithInFlight(1), guard.WithRules(plenty...), guard.WithTimeout(5*time.Second))
		boom := errors.New("provider down")
		if _, err := g.Do(ctx, "k", func(context.Context) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("Do with a failing fn = %v, want its error", err)
		}
		mustRun(t, g, "after an error")
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Fatalf("recovered %v, want fn's panic", p)
				}
			}()
			_, _ = g.Do(ctx, "k", func(context.Context) error { panic("boom") })
		}()
		mustRun(t, g, "after a panic")
	})
}

// mustRun fails t unless a Do of "k" on g runs its fn.
func mustRun(t *testing.T, g *guard.Guard, when string) {
	t.Helper()
	ran := false
	if d, err := g.Do(context.Background(), "k", func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("Do %s = %+v, %v, ran %v; want it run", when, d, err, ran)
	}
}

// TestInFlightMiddlewareBusy: Middleware answers a request that finds the
// key's permit held with 503, Retry-After 1 and a JSON error, without
// running the handler, and gives its unit back.
func TestInFlightMiddlewareBusy(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		g := newGuard(t, b, guard.WithInFlight(1), guard.WithRules(funnel.AtMost(2, time.Hour)), guard.WithTimeout(2*time.Second))
		in, out := make(chan struct{}), make(chan struct{})
		var calls atomic.Int64
		h := g.Middleware(guard.Header("X-Key"))(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if calls.Add(1) == 1 {
				close(in)
				<-out
			}
		}))
		serve := func() *httptest.ResponseRecorder {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, "/", nil)
			req.Header.Set("X-Key", "k")
			h.ServeHTTP(rec, req)
			return rec
		}
		first := make(chan int, 1)
		go func() { first <- serve().Code }()
		<-in
		rec := serve()
		var body struct {
			Error      string `json:"error"`
			RetryAfter int64  `json:"retry_after"`
		}
		_ = json.NewDecoder(rec.Body).Decode(&body)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" || !strings.Contains(body.Error, "in flight") || body.RetryAfter != 1 {
			t.Errorf("busy request = %d, Retry-After %q, %+v; want 503, 1 and an in-flight error", rec.Code, rec.Header().Get("Retry-After"), body)
		}
		close(out)
		if code := <-first; code != http.StatusOK {
			t.Errorf("first request = %d", code)
		}
		// The busy request's unit came back: a second admission fits the rule of 2.
		if rec := serve(); rec.Code != http.StatusOK {
			t.Errorf("after the busy request = %d, want 200", rec.Code)
		}
		if n := calls.Load(); n != 2 {
			t.Errorf("handler ran %d times, want 2", n)
		}
	})
}

// TestInFlightOtherSize: a guard of the same Prefix with another InFlight
// is refused while the key's semaphore lives (ErrRejected: it will not go
// away by itself), whatever OnError says; it does not run with no bound.
func TestInFlightOtherSize(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		g := newGuard(t, b, guard.WithInFlight(2), guard.WithRules(plenty...))
		other := newGuard(t, b, guard.WithInFlight(3), guard.WithRules(plenty...), guard.WithOnError(guard.FailOpen))
		_, wait := holdKey(t, g, "k")
		d, err := other.Do(ctx, "k", func(context.Context) error {
			t.Error("fn ran under another InFlight")
			return nil
		})
		if !errors.Is(err, guard.ErrRejected) || d.Allowed {
			t.Errorf("Do under another InFlight = %+v, %v; want a denial with ErrRejected", d, err)
		}
		if err := wait(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestInFlightShadow: in Shadow, Middleware lets a request that finds no
// permit through, as it does a denied one.
func TestInFlightShadow(t *testing.T) {
	b := testutil.Mini(t)
	g := newGuard(t, b, guard.WithInFlight(1), guard.WithRules(plenty...), guard.WithTimeout(2*time.Second), guard.WithShadow())
	_, wait := holdKey(t, g, "k")
	ran := false
	h := g.Middleware(guard.Header("X-Key"))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-Key", "k")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || !ran {
		t.Errorf("shadow, busy: %d, ran %v; want the handler run", rec.Code, ran)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

// TestInFlightRoundTrips: a permit costs a call of Do two round trips, one
// to take it (free: no wait) and one to give it back, on a key new and on
// one seen before.
func TestInFlightRoundTrips(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		// trips returns the round trips of a Do of a new key and of the
		// same key again, by a guard with opts.
		trips := func(name string, opts ...guard.Option) (fresh, seen int) {
			c := b.Client(t)
			rec := &testutil.CommandRecorder{}
			c.AddHook(rec)
			g, err := guard.New(c, append(opts, guard.WithPrefix(b.Prefix+name+":"), guard.WithRules(plenty...), guard.WithTimeout(10*time.Second))...)
			if err != nil {
				t.Fatal(err)
			}
			run := func(context.Context) error { return nil }
			// Every script loaded: the lock path's (a first call, with no
			// sample of the server's clock yet), a new key's, a returning one's.
			for _, k := range []string{"warm", "warm2", "warm2"} {
				if _, err := g.Do(ctx, k, run); err != nil {
					t.Fatal(err)
				}
			}
			for i, n := range []*int{&fresh, &seen} {
				rec.Reset()
				if _, err := g.Do(ctx, "k", run); err != nil {
					t.Fatal(err)
				}
				*n = rec.Trips()
				t.Logf("%s, Do %d: %q", name, i, rec.Shapes())
			}
			return fresh, seen
		}
		fresh, seen := trips("off")
		freshIF, seenIF := trips("on", guard.WithInFlight(4))
		if freshIF != fresh+2 || seenIF != seen+2 {
			t.Errorf("Do of a new key, of a seen one: %d, %d round trips with InFlight, %d, %d without; want 2 more", freshIF, seenIF, fresh, seen)
		}
	})
}
