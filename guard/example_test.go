package guard_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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

	g, _ := guard.New(client, guard.Policy{Prefix: "sms:phone:", Rules: []funnel.Rule{funnel.AtMost(1, time.Minute)}})
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

	g, _ := guard.New(client, guard.Policy{Rules: []funnel.Rule{funnel.AtMost(1, time.Minute)}})
	providerDown := fmt.Errorf("provider refused")
	_, err := g.Do(ctx, "+8613800138000", func(context.Context) error { return providerDown })
	fmt.Println("send:", err)
	d, _ := g.Do(ctx, "+8613800138000", func(context.Context) error { return nil })
	fmt.Println("refunded, so the retry is allowed:", d.Allowed)
	// Output:
	// send: provider refused
	// refunded, so the retry is allowed: true
}
