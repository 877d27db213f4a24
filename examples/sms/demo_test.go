package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

// demoProvider is the console provider, as a local demo runs it (its
// outbox makes the service a demo), that also records every message for
// the test.
type demoProvider struct {
	*ConsoleProvider
	sms *capture
}

func (p demoProvider) Send(ctx context.Context, to, text string) error {
	_ = p.sms.Send(ctx, to, text)
	return p.ConsoleProvider.Send(ctx, to, text)
}

// newDemoEnv returns an env whose service is a local demo: the console
// provider with the outbox (DemoOutbox, as main sets it on loopback).
func newDemoEnv(t *testing.T, opts ...func(*Config)) *env {
	t.Helper()
	b := testutil.Mini(t)
	b.Mini.SetTime(t0)
	cfg := testConfig()
	cfg.DemoOutbox = true
	for _, o := range opts {
		o(&cfg)
	}
	e := &env{t: t, b: b, cfg: cfg, sms: &capture{}, logs: &syncBuffer{}}
	svc, err := NewService(b.Client(t), cfg, demoProvider{&ConsoleProvider{out: io.Discard}, e.sms},
		slog.New(slog.NewTextHandler(e.logs, nil)))
	if err != nil {
		t.Fatalf("NewService: %v", err)
	}
	e.svc = svc
	e.srv = httptest.NewServer(svc.Handler())
	t.Cleanup(e.srv.Close)
	return e
}

// demoReset posts a reset of the demo's limits for phone, and returns the
// answer (its JSON is not a reply: it is read as a demoResetReply).
func (e *env) demoReset(phone string, headers ...string) resetAnswer {
	e.t.Helper()
	body, _ := json.Marshal(map[string]string{"phone": phone})
	return e.raw(http.MethodPost, "/api/demo/reset", string(body), headers...)
}

// resetAnswer is an answer of the service, read as a reset's.
type resetAnswer struct {
	status int
	header http.Header
	raw    string
	reset  demoResetReply
	err    string
}

func (r resetAnswer) String() string { return fmt.Sprint(r.status, " ", strings.TrimSpace(r.raw)) }

// raw sends a request with a JSON body (if any) and headers as name, value
// pairs, and reads the answer as a reset's, or an error.
func (e *env) raw(method, path, body string, headers ...string) resetAnswer {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	a := resetAnswer{status: res.StatusCode, header: res.Header, raw: string(b)}
	var rep struct {
		demoResetReply
		Error string `json:"error"`
	}
	_ = json.Unmarshal(b, &rep)
	a.reset, a.err = rep.demoResetReply, rep.Error
	return a
}

// wantReset fails the test unless r has status.
func (e *env) wantReset(r resetAnswer, status int, what string) {
	e.t.Helper()
	if r.status != status {
		e.t.Fatalf("%s = %v; want %d\nlogs:\n%s", what, r, status, e.logs)
	}
}

// demoSettings returns the page's settings.
func (e *env) demoSettings(headers ...string) settings {
	e.t.Helper()
	r := e.raw(http.MethodGet, "/api/sms/settings", "", headers...)
	var s settings
	if err := json.Unmarshal([]byte(r.raw), &s); err != nil {
		e.t.Fatal(err)
	}
	return s
}

// Outside a demo there is no reset: POST /api/demo/reset is a JSON 404,
// the settings say no demo, and the limits stay.
func TestDemoResetOutsideDemo(t *testing.T) {
	e := newEnv(t)
	e.want(e.send(number), http.StatusAccepted, "send")
	e.want(e.send(number), http.StatusTooManyRequests, "send within the cooldown")
	r := e.demoReset(number)
	e.wantReset(r, http.StatusNotFound, "POST /api/demo/reset outside a demo")
	if r.header.Get("Content-Type") != "application/json" || r.err != "not found" {
		t.Errorf("POST /api/demo/reset outside a demo = %v %v; want the API's JSON 404", r, r.header)
	}
	if e.demoSettings().Demo {
		t.Errorf("settings say demo outside a demo")
	}
	e.want(e.send(number), http.StatusTooManyRequests, "send within the cooldown, after the refused reset")
}

// In a demo, the reset is answered only to this machine: a request a proxy
// forwarded gets the 404, resets nothing, and its settings say no demo.
func TestDemoResetForwarded(t *testing.T) {
	e := newDemoEnv(t)
	if !e.demoSettings().Demo {
		t.Fatalf("settings of a demo, asked from loopback, say no demo")
	}
	e.want(e.send(number), http.StatusAccepted, "send")
	for _, h := range [][]string{{"X-Forwarded-For", "203.0.113.9"}, {"Forwarded", "for=203.0.113.9"}} {
		e.wantReset(e.demoReset(number, h...), http.StatusNotFound, "reset with "+h[0])
		if e.demoSettings(h...).Demo {
			t.Errorf("settings asked with %s say demo", h[0])
		}
	}
	e.want(e.send(number), http.StatusTooManyRequests, "send within the cooldown, after the refused resets")
}

// The reset lifts each limit a demo visitor meets: the address's sends
// (after ten sends from one address), the number's cooldown, the
// destination prefix's, the budget's, and the number's lockout after too
// many failed verifications; the send after it is accepted.
func TestDemoReset(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opt   func(*Config)
		sends []string // accepted, then the last one refused with scope
		scope string
		rule  string
	}{
		{"ten sends from one address", nil,
			[]string{phoneN(0), phoneN(1), phoneN(2), phoneN(3), phoneN(4), phoneN(5), phoneN(6), phoneN(7), phoneN(8), number, number},
			"ip", "ip-hourly"},
		{"cooldown", noIPLimits, []string{number, number}, "number", "cooldown"},
		{"prefix", func(c *Config) { noIPLimits(c); c.PrefixHourly = 2 }, []string{phoneN(1), phoneN(2), phoneN(3)}, "prefix", "prefix-hourly"},
		{"budget", func(c *Config) { noIPLimits(c); c.DailyBudget = 1 }, []string{phoneN(1), phoneN(2)}, "budget", "budget"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []func(*Config)
			if tc.opt != nil {
				opts = append(opts, tc.opt)
			}
			e := newDemoEnv(t, opts...)
			last := tc.sends[len(tc.sends)-1]
			for _, p := range tc.sends[:len(tc.sends)-1] {
				e.want(e.send(p), http.StatusAccepted, "send to "+p)
			}
			r := e.send(last)
			e.want(r, http.StatusTooManyRequests, "the last send")
			if r.body.Scope != tc.scope || r.body.Rule != tc.rule {
				t.Fatalf("the last send = %v; want scope %s, rule %s", r, tc.scope, tc.rule)
			}
			rr := e.demoReset(last)
			e.wantReset(rr, http.StatusOK, "reset")
			want := demoResetReply{Reset: []string{"address", "budget", "number", "prefix", "verify-failures"}, Number: last}
			if fmt.Sprint(rr.reset) != fmt.Sprint(want) {
				t.Errorf("reset = %v; want %+v", rr, want)
			}
			e.want(e.send(last), http.StatusAccepted, "the send after the reset")
		})
	}
}

// A number locked out of verification (too many failed verifications) is
// free again after the reset: it gets a code, and the code verifies.
func TestDemoResetLockout(t *testing.T) {
	e := newDemoEnv(t, noIPLimits)
	for round := range 2 { // 5 wrong guesses spend a code; 10 failures lock the number
		e.want(e.send(number), http.StatusAccepted, "send")
		code := e.sms.code(t, number)
		for i := range e.cfg.MaxAttempts {
			e.want(e.verify(number, wrong(code, int(i))), http.StatusUnauthorized, "wrong code")
		}
		e.at(time.Duration(round+1) * e.cfg.Cooldown)
	}
	r := e.send(number)
	if r.status != http.StatusTooManyRequests || r.body.Rule != "verify-failures" {
		t.Fatalf("send to a locked-out number = %v; want 429 verify-failures", r)
	}
	// A reset of the address only (no number) leaves the lockout.
	e.wantReset(e.demoReset(""), http.StatusOK, "reset without a number")
	e.want(e.send(number), http.StatusTooManyRequests, "send after a reset of the address only")
	e.wantReset(e.demoReset(" 138 0013 8000"), http.StatusOK, "reset")
	e.want(e.send(number), http.StatusAccepted, "send after the reset")
	e.want(e.verify(number, e.sms.code(t, number)), http.StatusOK, "the right code after the reset")
}

// The binary, run as the README says (console provider, loopback): a demo,
// whose picker offers a handful of countries and whose reset is served;
// with -trust-proxy it is not a demo: one country, and no reset.
func TestBinaryDemo(t *testing.T) {
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	check := func(p *process, demo bool, regions []string, resetStatus int) {
		t.Helper()
		res, err := client.Get(p.base + "/api/sms/settings")
		if err != nil {
			t.Fatal(err)
		}
		var s settings
		err = json.NewDecoder(res.Body).Decode(&s)
		res.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range s.Countries {
			got = append(got, c.Region)
		}
		if s.Demo != demo || !slices.Equal(got, regions) {
			t.Errorf("settings: demo %v, countries %v; want demo %v, countries %v", s.Demo, got, demo, regions)
		}
		res, err = client.Post(p.base+"/api/demo/reset", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != resetStatus {
			t.Errorf("POST /api/demo/reset = %d %s; want %d", res.StatusCode, body, resetStatus)
		}
		p.stop(t)
	}
	// The default region first, then by name.
	check(startBinary(t, nil), true, []string{"CN", "FR", "DE", "IN", "GB", "US"}, http.StatusOK)
	check(startBinary(t, nil, "-region", "JP"), true, []string{"JP", "CN", "FR", "DE", "IN", "GB", "US"}, http.StatusOK)
	check(startBinary(t, nil, "-countries", "CN,GB"), true, []string{"CN", "GB"}, http.StatusOK)
	check(startBinary(t, nil, "-trust-proxy"), false, []string{"CN"}, http.StatusNotFound)
}
