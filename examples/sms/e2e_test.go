package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// The curl session of the README: send, a wrong code, the right one, and
// the right one again.
func TestSendVerify(t *testing.T) {
	e := newEnv(t)
	r := e.send(number)
	e.want(r, http.StatusAccepted, "send")
	if r.body.RetryAfter == nil || *r.body.RetryAfter != 60 || r.body.Error != "" {
		t.Fatalf("send = %v; want {\"retry_after\":60}", r)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("send: Content-Type %q", ct)
	}
	ms := e.sms.messages()
	if len(ms) != 1 || ms[0].to != number {
		t.Fatalf("messages = %v; want one to %s", ms, number)
	}
	code := e.sms.code(t, number)

	r = e.verify(number, wrong(code, 0))
	e.want(r, http.StatusUnauthorized, "wrong code")
	if r.body.Error == "" || r.body.Verified {
		t.Fatalf("wrong code = %v; want an error", r)
	}
	r = e.verify(number, code)
	e.want(r, http.StatusOK, "right code")
	if !r.body.Verified || r.body.Error != "" {
		t.Fatalf("right code = %v; want {\"verified\":true}", r)
	}
	e.want(e.verify(number, code), http.StatusUnauthorized, "the same code again")
}

// A code is valid for CodeTTL, then gone.
func TestCodeExpires(t *testing.T) {
	e := newEnv(t)
	e.want(e.send(number), http.StatusAccepted, "send")
	code := e.sms.code(t, number)
	e.b.Mini.FastForward(e.cfg.CodeTTL)
	e.want(e.verify(number, code), http.StatusUnauthorized, "code after its TTL")

	e.at(time.Minute)
	e.want(e.send(number), http.StatusAccepted, "second send")
	code = e.sms.code(t, number)
	e.b.Mini.FastForward(e.cfg.CodeTTL - time.Second)
	e.want(e.verify(number, code), http.StatusOK, "code a second before its TTL")
}

// 200 wrong codes at once for one number: at most MaxAttempts are compared,
// all are answered 401 (the guesses after the last attempt find no code),
// only the guesses compared with the code count as failures, and the right
// code is refused afterwards.
func TestBruteForce(t *testing.T) {
	b := testutil.Mini(t)
	b.Mini.SetTime(t0)
	// Enough connections and time for 200 requests at once under -race:
	// this test is about attempts, not about a slow Redis.
	client := b.ClientOpts(t, &redis.Options{PoolSize: 256})
	e := newEnvOn(t, client, noIPLimits, func(c *Config) { c.Timeout = 10 * time.Second })
	e.b = b
	chk := e.watchChecks()

	e.want(e.send(number), http.StatusAccepted, "send")
	code := e.sms.code(t, number)

	const n = 200
	count := e.verifyAtOnce(number, n, func(i int) string { return wrong(code, i) })
	t.Logf("statuses of %d wrong codes: %v", n, count)
	if count[http.StatusUnauthorized] != n {
		t.Fatalf("statuses = %v; want only 401", count)
	}
	if got, max := chk.wrong.Load(), e.cfg.MaxAttempts; got > max || got < 1 {
		t.Fatalf("%d codes compared; want 1 to %d", got, max)
	} else if got != max {
		t.Errorf("%d codes compared; want %d (200 attempts)", got, max)
	}
	// Failures count only for guesses compared with a live code: the last
	// of the MaxAttempts spent it, and every later guess found no code.
	res, err := e.svc.failures.Peek(context.Background(), e.svc.codes.key(number), e.cfg.failureRule())
	if err != nil {
		t.Fatal(err)
	}
	if want := e.cfg.MaxDailyFailures - e.cfg.MaxAttempts; res.Remaining != want {
		t.Errorf("daily failures left = %d; want %d (%d compared)", res.Remaining, want, e.cfg.MaxAttempts)
	}
	if r := e.verify(number, code); r.status == http.StatusOK {
		t.Fatalf("the right code after the brute force = %v; want it refused", r)
	}
}

// verifyQuiet is verify for goroutines other than the test's: it returns
// the status, or 0 on a transport error.
func (e *env) verifyQuiet(phone, code string) int {
	body := fmt.Sprintf(`{"phone":%q,"code":%q}`, phone, code)
	res, err := e.srv.Client().Post(e.srv.URL+"/api/sms/verify", "application/json", strings.NewReader(body))
	if err != nil {
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// More than MaxDailyFailures wrong codes for one number, across codes,
// lock its verification for the day, even with the right code.
func TestDailyFailures(t *testing.T) {
	e := newEnv(t, noIPLimits)
	for i := range 2 { // 2 codes × 5 wrong = 10 failures
		e.at(time.Duration(i) * 61 * time.Second)
		e.want(e.send(number), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
		code := e.sms.code(t, number)
		for j := range 5 {
			e.want(e.verify(number, wrong(code, j)), http.StatusUnauthorized, fmt.Sprintf("code %d, wrong guess %d", i+1, j+1))
		}
	}
	// Locked out: no third code (a paid SMS that could not be used), with
	// the time left, until a failure has leaked out of the day's budget.
	e.at(122 * time.Second)
	r := e.send(number)
	e.want(r, http.StatusTooManyRequests, "send 3, locked out")
	if r.body.Scope != "number" || r.body.Rule != "verify-failures" {
		t.Fatalf("send while locked out = %v; want scope number, rule verify-failures", r)
	}
	if left := e.retryAfter(r, "send while locked out"); left < 23*3600 || left > 24*3600 {
		t.Fatalf("send while locked out: retry after %d s; want the day's lockout, under 24 h", left)
	}
	if n := len(e.sms.messages()); n != 2 {
		t.Fatalf("%d messages; want 2, none while locked out", n)
	}
	e.b.Mini.FastForward(e.cfg.CodeTTL) // the second code expires
	e.want(e.verify(number, "123456"), http.StatusUnauthorized, "a guess while locked out, with no code")

	e.at(122*time.Second + time.Duration(*r.body.RetryAfter)*time.Second)
	e.want(e.send(number), http.StatusAccepted, "send after the lockout")
	code := e.sms.code(t, number)
	e.want(e.verify(number, wrong(code, 0)), http.StatusUnauthorized, "a wrong code, the unit that leaked")
	r = e.verify(number, wrong(code, 1))
	e.want(r, http.StatusTooManyRequests, "a wrong code, the budget spent again")
	if r.body.Scope != "number" || r.body.Rule != "verify-failures" {
		t.Fatalf("wrong code past the budget = %v; want scope number, rule verify-failures", r)
	}
	e.retryAfter(r, "wrong code past the budget")
	e.want(e.verify(number, code), http.StatusTooManyRequests, "the right code after 10 failures")

	other := phoneN(1)
	e.want(e.send(other), http.StatusAccepted, "send to another number")
	e.want(e.verify(other, e.sms.code(t, other)), http.StatusOK, "another number's code")
}

// Every spelling of one number is one number: one bucket, one code.
func TestNormalisation(t *testing.T) {
	spellings := []string{"138 0013 8000", "+86 138-0013-8000", "008613800138000", "１３８００１３８０００"}
	for i, first := range spellings {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			e := newEnv(t, noIPLimits)
			e.want(e.send(first), http.StatusAccepted, fmt.Sprintf("send to %q", first))
			if ms := e.sms.messages(); len(ms) != 1 || ms[0].to != number {
				t.Fatalf("messages = %v; want one to %s", ms, number)
			}
			for _, other := range spellings {
				e.want(e.send(other), http.StatusTooManyRequests, fmt.Sprintf("send to %q after %q", other, first))
			}
			other := spellings[(i+1)%len(spellings)]
			e.want(e.verify(other, e.sms.code(t, number)), http.StatusOK, fmt.Sprintf("verify as %q", other))
		})
	}
}

// Bad numbers and bodies are refused before any limit or message.
func TestBadRequests(t *testing.T) {
	e := newEnv(t)
	valid := `{"phone":"13800138000"}`
	for _, c := range []struct{ name, path, body string }{
		{"short number", "send", `{"phone":"12345"}`},
		{"empty number", "send", `{"phone":""}`},
		{"no country", "send", `{"phone":"+999"}`},
		{"1 KiB of digits", "send", `{"phone":"` + strings.Repeat("1", 1024) + `"}`},
		{"letters", "send", `{"phone":"call me"}`},
		{"malformed JSON", "send", `{"phone":`},
		{"not JSON", "send", `phone=13800138000`},
		{"no body", "send", ``},
		{"unknown field", "send", `{"phone":"13800138000","channel":"voice"}`},
		{"number not a string", "send", `{"phone":13800138000}`},
		{"two objects", "send", valid + valid},
		{"over 4 KiB", "send", strings.Repeat(" ", 4096) + valid},
		{"short code", "verify", `{"phone":"13800138000","code":"12345"}`},
		{"long code", "verify", `{"phone":"13800138000","code":"1234567"}`},
		{"code with letters", "verify", `{"phone":"13800138000","code":"12345a"}`},
		{"full-width code", "verify", `{"phone":"13800138000","code":"１２３４５６"}`},
		{"verify bad number", "verify", `{"phone":"12345","code":"123456"}`},
		{"verify unknown field", "verify", `{"phone":"13800138000","code":"123456","x":1}`},
	} {
		want := http.StatusBadRequest
		if len(c.body) > maxBody {
			want = http.StatusRequestEntityTooLarge
		}
		r := e.do("POST", "/api/sms/"+c.path, c.body)
		if r.status != want || r.body.Error == "" {
			t.Errorf("%s: %v; want %d with an error", c.name, r, want)
		}
	}
	if ms := e.sms.messages(); len(ms) != 0 {
		t.Fatalf("messages = %v; want none", ms)
	}
	// The limit is on the body, not the whitespace: just under 4 KiB is fine,
	// and none of the refusals above took a unit of the number.
	e.want(e.do("POST", "/api/sms/send", strings.Repeat(" ", 4000)+valid), http.StatusAccepted, "send of a 4 KiB body")
}

// A message the provider refuses is not charged: neither to the number nor
// to the address, and its code is void.
func TestProviderFailure(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.IPHourly = 1 })
	e.sms.fail(true)
	r := e.send(number)
	e.want(r, http.StatusBadGateway, "send the provider refuses")
	if r.body.Error == "" {
		t.Fatalf("send = %v; want an error", r)
	}
	lost := e.sms.code(t, number)
	e.want(e.verify(number, lost), http.StatusUnauthorized, "the code of the refused message")
	if got := e.metric("sms_sends_total", `result="provider_error"`); got != 1 {
		t.Fatalf("provider errors = %v; want 1", got)
	}

	e.sms.fail(false)
	e.want(e.send(number), http.StatusAccepted, "send after the refusal")
	e.want(e.verify(number, e.sms.code(t, number)), http.StatusOK, "the new code")
}

// With Redis gone the service refuses to send (an SMS costs money) and says
// when to retry; health says so too.
func TestFailClosed(t *testing.T) {
	srv := testutil.StartServer(t)
	e := newEnvOn(t, srv.Client(t), func(c *Config) { c.Timeout = DefaultConfig().Timeout })

	r := e.do("GET", "/healthz", nil)
	e.want(r, http.StatusOK, "healthz")
	e.want(e.send(number), http.StatusAccepted, "send")
	code := e.sms.code(t, number)

	srv.Kill()
	start := time.Now()
	r = e.send(phoneN(1))
	e.want(r, http.StatusServiceUnavailable, "send without Redis")
	e.retryAfter(r, "send without Redis")
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("send without Redis took %v; want about Timeout (%v)", d, e.cfg.Timeout)
	}
	if ms := e.sms.messages(); len(ms) != 1 {
		t.Fatalf("messages = %v; want only the one sent before the kill", ms)
	}
	r = e.verify(number, code)
	e.want(r, http.StatusServiceUnavailable, "verify without Redis")
	e.retryAfter(r, "verify without Redis")
	e.want(e.do("GET", "/healthz", nil), http.StatusServiceUnavailable, "healthz without Redis")
	if got := e.metric("sms_sends_total", `result="unavailable"`); got != 1 {
		t.Fatalf("unavailable sends = %v; want 1", got)
	}
}

// /metrics counts sends and verifications by outcome.
func TestMetrics(t *testing.T) {
	e := newEnv(t)
	e.want(e.send(number), http.StatusAccepted, "send")
	e.want(e.send(number), http.StatusTooManyRequests, "second send")
	code := e.sms.code(t, number)
	e.want(e.verify(number, wrong(code, 0)), http.StatusUnauthorized, "wrong code")
	e.want(e.verify(number, code), http.StatusOK, "right code")

	r := e.do("GET", "/metrics", nil)
	e.want(r, http.StatusOK, "metrics")
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("metrics Content-Type %q", ct)
	}
	for _, s := range []struct {
		name, labels string
		want         float64
	}{
		{"sms_sends_total", `result="sent"`, 1},
		{"sms_sends_total", `result="denied"`, 1},
		{"sms_verify_total", `outcome="wrong"`, 1},
		{"sms_verify_total", `outcome="ok"`, 1},
		{"sms_denials_total", `guard="phone",rule="cooldown"`, 1},
		{"sms_guard_seconds_count", `guard="phone"`, 2},
		{"sms_guard_seconds_count", `guard="ip"`, 2},
	} {
		if got := e.metric(s.name, s.labels); got != s.want {
			t.Errorf("%s{%s} = %v; want %v", s.name, s.labels, got, s.want)
		}
	}
}

// The page is served at /.
func TestPage(t *testing.T) {
	e := newEnv(t)
	r := e.do("GET", "/", nil)
	e.want(r, http.StatusOK, "GET /")
	for _, s := range []string{`id="country"`, `id="phone"`, `id="send"`, `id="code"`, `id="verify"`, `id="status"`, `src="/app.js"`} {
		if !strings.Contains(r.raw, s) {
			t.Errorf("page lacks %s", s)
		}
	}
	js := e.do("GET", "/app.js", nil)
	e.want(js, http.StatusOK, "GET /app.js")
	for _, s := range []string{"retry_after", "Retry-After", "/api/sms/settings"} {
		if !strings.Contains(js.raw, s) {
			t.Errorf("the page's script lacks %s", s)
		}
	}
}
