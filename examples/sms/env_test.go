package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// t0 is where the tests' miniredis clock starts: the funnels read the
// server's TIME, so Mini.SetTime moves them; code TTLs move only with
// Mini.FastForward.
var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

const number = "+8613800138000" // E.164 of the tests' usual number

// message is one text a Provider was asked to deliver.
type message struct{ to, text string }

// capture is a Provider that records every message, and refuses them while
// failing is set (the message is recorded all the same, so a test can see
// the code that was never delivered).
type capture struct {
	mu      sync.Mutex
	sent    []message
	failing bool
}

var errGateway = errors.New("gateway: message refused")

func (p *capture) Send(_ context.Context, to, text string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent = append(p.sent, message{to, text})
	if p.failing {
		return errGateway
	}
	return nil
}

func (p *capture) fail(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failing = on
}

func (p *capture) messages() []message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]message(nil), p.sent...)
}

var codeRE = regexp.MustCompile(`code is ([0-9]{6})\b`)

// code returns the code of the last message to the E.164 number to.
func (p *capture) code(t testing.TB, to string) string {
	t.Helper()
	ms := p.messages()
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].to != to {
			continue
		}
		m := codeRE.FindStringSubmatch(ms[i].text)
		if m == nil {
			t.Fatalf("message to %s has no code: %q", to, ms[i].text)
		}
		return m[1]
	}
	t.Fatalf("no message to %s in %v", to, ms)
	return ""
}

// verifyAtOnce sends n verifications for number at the same instant, the
// i-th with code(i), and counts the answers by status.
func (e *env) verifyAtOnce(number string, n int, code func(i int) string) map[int]int {
	statuses := make([]int, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			statuses[i] = e.verifyQuiet(number, code(i))
		})
	}
	close(start)
	wg.Wait()
	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	return count
}

// wrong returns a code that is not code.
func wrong(code string, i int) string {
	n, _ := strconv.Atoi(code)
	return pad6((n + 1 + i) % 1_000_000)
}

func pad6(n int) string {
	s := strconv.Itoa(n)
	return strings.Repeat("0", 6-len(s)) + s
}

// syncBuffer is a log destination safe for concurrent handlers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// env is one Service on a fresh miniredis (or another Redis), served by
// httptest, with a capturing provider and its logs in a buffer.
type env struct {
	t    testing.TB
	b    *testutil.Backend // nil on a real server
	cfg  Config
	svc  *Service
	srv  *httptest.Server
	sms  *capture
	logs *syncBuffer
}

// testConfig is DefaultConfig with a fixed secret and a Redis Timeout of
// 10 s: the default 500 ms is a product setting, and a test that passed only
// when every Redis call returned within it would test the machine's speed.
// The tests of what a Timeout does set one of their own.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Secret = []byte("test secret of 32 bytes, fixed..")
	cfg.Timeout = 10 * time.Second
	cfg.Countries = []string{"CN", "GB"} // the tests' numbers: +86 mobiles, a +44 mobile
	// The pumping limits and the budget out of the way of the tests of
	// other rules (many of their numbers share a prefix); their own tests
	// set them.
	cfg.PrefixHourly, cfg.PrefixDaily, cfg.DailyBudget = 100_000, 100_000, 10_000_000
	cfg.Conversion.MinRate = 0 // the conversion guard too (conversion_test.go)
	cfg.Spend.Daily = 0        // and the money guards (spend_test.go)
	cfg.Pools.Off = true       // and the pools (pool_test.go)
	// And the bound on the provider's calls in flight, which a test of 64
	// sends at once under -race would meet (inflight_test.go).
	cfg.ProviderInFlight = 0
	return cfg
}

// noIPLimits lifts the per-IP limits, of sends and of verifications, so that
// tests of the per-number rules, all from 127.0.0.1, see only those.
func noIPLimits(c *Config) { c.IPHourly, c.IPDaily, c.IPVerifyHourly = 1000, 1000, 100_000 }

// newEnv returns an env on a fresh miniredis whose clock stands at t0.
func newEnv(t testing.TB, opts ...func(*Config)) *env {
	t.Helper()
	b := testutil.Mini(t)
	b.Mini.SetTime(t0)
	e := newEnvOn(t, b.Client(t), opts...)
	e.b = b
	return e
}

// newEnvOn returns an env on client.
func newEnvOn(t testing.TB, client redis.UniversalClient, opts ...func(*Config)) *env {
	t.Helper()
	cfg := testConfig()
	for _, o := range opts {
		o(&cfg)
	}
	e := &env{t: t, cfg: cfg, sms: &capture{}, logs: &syncBuffer{}}
	// No time attribute: the log is scanned for codes, and a clock has digits.
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
	svc, err := NewService(client, cfg, e.sms, log)
	if err != nil {
		t.Fatalf("NewService: %v", err)
	}
	e.svc = svc
	e.srv = httptest.NewServer(svc.Handler())
	t.Cleanup(e.srv.Close)
	return e
}

// at sets the miniredis clock to t0+d.
func (e *env) at(d time.Duration) { e.b.Mini.SetTime(t0.Add(d)) }

// response is one answer of the service.
type response struct {
	status int
	header http.Header
	raw    string
	body   reply
}

func (r response) String() string { return strconv.Itoa(r.status) + " " + strings.TrimSpace(r.raw) }

// do sends a request with body (a string as it is, anything else as JSON)
// and headers as name, value pairs.
func (e *env) do(method, path string, body any, headers ...string) response {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatalf("%s %s: read: %v", method, path, err)
	}
	r := response{status: res.StatusCode, header: res.Header, raw: string(raw)}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") && method != http.MethodHead {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r.body); err != nil {
			e.t.Fatalf("%s %s: reply %q: %v", method, path, raw, err)
		}
	}
	return r
}

func (e *env) send(phone string, headers ...string) response {
	e.t.Helper()
	return e.do("POST", "/api/sms/send", map[string]string{"phone": phone}, headers...)
}

func (e *env) verify(phone, code string) response {
	e.t.Helper()
	return e.do("POST", "/api/sms/verify", map[string]string{"phone": phone, "code": code})
}

// want fails the test unless r has the status.
func (e *env) want(r response, status int, what string) {
	e.t.Helper()
	if r.status != status {
		e.t.Fatalf("%s = %v; want %d\nlogs:\n%s", what, r, status, e.logs)
	}
}

// retryAfter checks that r says when to come back, in whole seconds, the
// same in the header and the body, and returns it.
func (e *env) retryAfter(r response, what string) int64 {
	e.t.Helper()
	h := r.header.Get("Retry-After")
	sec, err := strconv.ParseInt(h, 10, 64)
	if err != nil || sec < 1 {
		e.t.Fatalf("%s: Retry-After %q; want whole seconds >= 1 (%v)", what, h, r)
	}
	if r.body.RetryAfter == nil || *r.body.RetryAfter != sec {
		e.t.Fatalf("%s: body %s; want retry_after %d as in the header", what, r.raw, sec)
	}
	if r.body.Error == "" {
		e.t.Fatalf("%s: body %s has no error", what, r.raw)
	}
	return sec
}

// metric returns the value of the sample name{labels} (labels as
// Prometheus writes them: sorted, quoted), or 0 when there is none.
func (e *env) metric(name, labels string) float64 {
	e.t.Helper()
	r := e.do("GET", "/metrics", nil)
	e.want(r, http.StatusOK, "GET /metrics")
	series := name
	if labels != "" {
		series += "{" + labels + "}"
	}
	sc := bufio.NewScanner(strings.NewReader(r.raw))
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				e.t.Fatalf("metric line %q: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// denials returns how many sends the guard's rule denied.
func (e *env) denials(guard, rule string) float64 {
	e.t.Helper()
	return e.metric("sms_denials_total", `guard="`+guard+`",rule="`+rule+`"`)
}
