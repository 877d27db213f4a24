package guard_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/redis/go-redis/v9"
)

// exampleGuard returns a guard with opts on an in-process miniredis.
func exampleGuard(opts ...guard.Option) (*guard.Guard, func()) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	g, err := guard.New(client, opts...)
	if err != nil {
		panic(err)
	}
	return g, func() { client.Close(); m.Close() }
}

// hit sends one request with header X-User to h and prints the status.
func hit(h http.Handler, user string, header ...string) {
	r := httptest.NewRequest(http.MethodPost, "/api", nil)
	r.Header.Set("X-User", user)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Println(strings.TrimSpace(fmt.Sprint(w.Code, " ", w.Body.String())))
}

func user(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }

var accepted = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) })

func ExampleWithDeniedHandler() {
	g, stop := exampleGuard(guard.WithRules(funnel.AtMost(1, time.Minute)))
	defer stop()
	h := g.Middleware(user, guard.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, d guard.Decision) {
		w.Header().Set("Retry-After", strconv.FormatInt(guard.RetryAfterSeconds(d.RetryAfter), 10))
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, "slow down: try again in %v", d.RetryAfter.Round(time.Second))
	}))(accepted)
	hit(h, "ann")
	hit(h, "ann")
	// Output:
	// 202
	// 429 slow down: try again in 1m0s
}

func ExampleWithErrorHandler() {
	g, stop := exampleGuard(guard.WithRules(funnel.AtMost(1, time.Minute)))
	defer stop()
	h := g.Middleware(user, guard.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, d guard.Decision, err error) {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, "who are you?")
	}))(accepted)
	hit(h, "") // an empty key is invalid
	// Output: 401 who are you?
}

// A KeyFunc says what the client can fix with a RequestError: Middleware
// answers with its Fix, never with the error, which may quote the request.
// The KeyFuncs of this package do the same.
func ExampleRequestError() {
	g, stop := exampleGuard(guard.WithRules(funnel.AtMost(1, time.Minute)))
	defer stop()
	account := func(r *http.Request) (string, error) {
		id := r.Header.Get("X-Account")
		if _, err := strconv.ParseUint(id, 10, 64); err != nil {
			return "", &guard.RequestError{Fix: "X-Account must be an account number", Err: err}
		}
		return id, nil
	}
	hit(g.Middleware(account)(accepted), "ann", "X-Account", "42")
	hit(g.Middleware(account)(accepted), "ann", "X-Account", "forty-two")
	hit(g.Middleware(guard.Header("X-Api-Key"))(accepted), "ann")
	// Output:
	// 202
	// 400 {"error":"X-Account must be an account number"}
	// 400 {"error":"missing header X-Api-Key"}
}

func ExampleWithSkip() {
	g, stop := exampleGuard(guard.WithRules(funnel.AtMost(1, time.Minute)))
	defer stop()
	internal := func(r *http.Request) bool { return r.Header.Get("X-Internal") == "yes" }
	h := g.Middleware(user, guard.WithSkip(internal))(accepted)
	hit(h, "bob", "X-Internal", "yes")
	hit(h, "bob", "X-Internal", "yes")
	hit(h, "bob")
	// Output:
	// 202
	// 202
	// 202
}

func ExampleWithCost() {
	g, stop := exampleGuard(guard.WithRules(funnel.AtMost(10, time.Minute)))
	defer stop()
	items := func(r *http.Request) (int64, error) { return strconv.ParseInt(r.Header.Get("X-Items"), 10, 64) }
	h := g.Middleware(user, guard.WithCost(items))(accepted)
	hit(h, "cy", "X-Items", "8")
	hit(h, "cy", "X-Items", "8") // 2 left: 6 more leak out in 6 minutes
	hit(h, "cy", "X-Items", "2")
	// Output:
	// 202
	// 429 {"error":"too many requests","retry_after":360}
	// 202
}

func ExampleFromContext() {
	g, stop := exampleGuard(guard.WithRules(funnel.AtMost(3, time.Minute)))
	defer stop()
	h := g.Middleware(user)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := guard.FromContext(r.Context())
		fmt.Fprintf(w, "%d left", d.Remaining)
	}))
	hit(h, "di")
	hit(h, "di")
	// Output:
	// 200 2 left
	// 200 1 left
}

// A new limit rolled out dark: every request goes through, and the handler
// (or WithObserve) sees what the limit would have done.
func ExampleWithShadow() {
	g, stop := exampleGuard(guard.WithRules(funnel.AtMost(1, time.Minute)), guard.WithShadow())
	defer stop()
	h := g.Middleware(user)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := guard.FromContext(r.Context())
		fmt.Fprintf(w, "would be allowed: %v", d.Allowed)
	}))
	hit(h, "ed")
	hit(h, "ed")
	// Output:
	// 200 would be allowed: true
	// 200 would be allowed: false
}

// Brute force of a verification code: three checks an hour, and five
// denials within ten minutes shut the number out for a day.
func ExampleWithFunnel_penalty() {
	g, stop := exampleGuard(
		guard.WithRules(funnel.AtMost(3, time.Hour)),
		guard.WithFunnel(funnel.WithPenalty(funnel.Penalty{Denials: 5, Within: 10 * time.Minute, For: 24 * time.Hour})),
	)
	defer stop()
	h := g.Middleware(user, guard.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, d guard.Decision) {
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, "denied by %s", d.Rule)
	}))(accepted)
	for range 9 {
		hit(h, "guesser")
	}
	// Output:
	// 202
	// 202
	// 202
	// 429 denied by 3/1h0m0s
	// 429 denied by 3/1h0m0s
	// 429 denied by 3/1h0m0s
	// 429 denied by 3/1h0m0s
	// 429 denied by penalty
	// 429 denied by penalty
}

func ExampleWithRateLimitHeaders() {
	g, stop := exampleGuard(guard.WithRules(funnel.AtMost(10, time.Minute)), guard.WithRateLimitHeaders())
	defer stop()
	r := httptest.NewRequest(http.MethodPost, "/api", nil)
	r.Header.Set("X-User", "fay")
	w := httptest.NewRecorder()
	g.Middleware(user)(accepted).ServeHTTP(w, r)
	fmt.Println(w.Header().Get("RateLimit-Policy"))
	rl, _, _ := strings.Cut(w.Header().Get("RateLimit"), ";pk=")
	fmt.Println(rl)
	// Output:
	// "10/1m0s";q=10;w=60
	// "10/1m0s";r=9;t=60
}
