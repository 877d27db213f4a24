package guard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/redis/go-redis/v9"
)

// The five lines a new user copies: a guard, and its middleware around the
// handler that sends the code.
func Example_handler() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	sendCode := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) })

	g, _ := guard.New(client, guard.WithPrefix("sms:phone:"), guard.WithRules(funnel.AtMost(1, time.Minute)))
	mux := http.NewServeMux()
	mux.Handle("POST /send", g.Middleware(guard.JSONField("phone", 4<<10))(sendCode))

	srv := httptest.NewServer(mux)
	defer srv.Close()
	for range 2 {
		res, _ := http.Post(srv.URL+"/send", "application/json", strings.NewReader(`{"phone": "+8613800138000"}`))
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(strings.TrimSpace(fmt.Sprint(res.StatusCode, " ", res.Header.Get("Retry-After"), " ", string(body))))
	}
	// Output:
	// 202
	// 429 60 {"error":"too many requests","retry_after":60}
}

func ExampleGuard_Do() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	ctx := context.Background()

	g, _ := guard.New(client, guard.WithRules(funnel.AtMost(1, time.Minute)))
	providerDown := fmt.Errorf("provider refused")
	_, err := g.Do(ctx, "+8613800138000", func(context.Context) error { return providerDown })
	fmt.Println("send:", err)
	d, _ := g.Do(ctx, "+8613800138000", func(context.Context) error { return nil })
	fmt.Println("refunded, so the retry is allowed:", d.Allowed)
	// Output:
	// send: provider refused
	// refunded, so the retry is allowed: true
}

// At most one export per tenant runs at once, across the fleet: a second
// one waits for the first for Timeout, then is refused with ErrBusy (and
// Middleware answers it 503 with Retry-After).
func ExampleWithInFlight() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	ctx := context.Background()

	g, _ := guard.New(client,
		guard.WithPrefix("export:"),
		guard.WithRules(funnel.AtMost(100, time.Hour)),
		guard.WithInFlight(1), // a call waits for a permit for Timeout (500 ms by default)
	)
	_, _ = g.Do(ctx, "tenant-7", func(ctx context.Context) error {
		d, err := g.Do(ctx, "tenant-7", func(context.Context) error { return nil })
		fmt.Println("second export:", d.Allowed, errors.Is(err, guard.ErrBusy), d.RetryAfter)
		return nil
	})
	d, err := g.Do(ctx, "tenant-7", func(context.Context) error { return nil })
	fmt.Println("after the first:", d.Allowed, err)
	// Output:
	// second export: false true 1s
	// after the first: true <nil>
}

// Enter decides a call of any transport as Middleware decides a request:
// here a job of a queue consumer, one unit per job and at most one job
// per tenant running at once. The call runs only if Admitted, in its
// Context, and Done gives its InFlight permit back.
func ExampleGuard_Enter() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	ctx := context.Background()

	g, _ := guard.New(client,
		guard.WithPrefix("jobs:"),
		guard.WithRules(funnel.Window(2, time.Hour)),
		guard.WithInFlight(1),
	)
	handle := func(tenant string) {
		call, err := g.Enter(ctx, tenant, 1)
		defer call.Done()
		switch {
		case errors.Is(err, guard.ErrBusy):
			fmt.Println("busy, retry in", call.Decision.RetryAfter)
		case err != nil:
			fmt.Println("error:", err)
		case !call.Admitted():
			fmt.Println("denied by", call.Decision.Rule)
		default:
			d, _ := guard.FromContext(call.Context()) // what the job itself sees
			fmt.Println("run,", d.Remaining, "left")
		}
	}
	first, _ := g.Enter(ctx, "tenant-7", 1) // a job of tenant-7 still running
	handle("tenant-7")
	first.Done()
	handle("tenant-7")
	handle("tenant-7")
	// Output:
	// busy, retry in 1s
	// run, 0 left
	// denied by 2 in 1h0m0s
}

// Plans per tenant: the rules of each call are its tenant's plan at the
// call, so an upgrade or a downgrade takes effect on the next call, with
// what the tenant took kept.
func ExampleWithPlans() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	ctx := context.Background()

	var mu sync.Mutex
	plans := map[string]string{"acme": "pro"} // kept in memory, changed at run time
	g, _ := guard.New(client,
		guard.WithPrefix("api:tenant:"),
		guard.WithRules(funnel.Window(10, time.Minute)), // a tenant of plan ""
		guard.WithPlans(map[string][]funnel.Rule{
			"free": {funnel.Window(10, time.Minute)},
			"pro":  {funnel.Window(1000, time.Minute)},
		}, func(_ context.Context, tenant string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			return plans[tenant], nil
		}),
	)
	d, _ := g.AllowN(ctx, "acme", 50)
	fmt.Println("50 calls on pro:", d.Allowed)

	mu.Lock()
	plans["acme"] = "free"
	mu.Unlock()
	d, _ = g.Allow(ctx, "acme")
	fmt.Println("then on free:", d.Allowed, d.Rule)
	// Output:
	// 50 calls on pro: true
	// then on free: false 10 in 1m0s
}
