package main

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

// Every error of the service is JSON, the router's 404 and 405 included,
// and every answer carries the security headers: the page cannot be framed,
// runs its own script only, and nothing is sniffed.
func TestAnswersAreJSONAndSecured(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/nope", http.StatusNotFound, ""},
		{"GET", "/api/sms/nope", http.StatusNotFound, ""},
		{"POST", "/", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"DELETE", "/api/sms/send", http.StatusMethodNotAllowed, "POST"},
		{"GET", "/api/sms/verify", http.StatusMethodNotAllowed, "POST"},
		{"POST", "/healthz", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"GET", "/api/sms/outbox", http.StatusNotFound, ""}, // no demo outbox in this env
	} {
		r := e.do(tc.method, tc.path, nil)
		e.want(r, tc.status, tc.method+" "+tc.path)
		if r.header.Get("Content-Type") != "application/json" || r.body.Error == "" {
			t.Errorf("%s %s = %v, Content-Type %q; want a JSON error", tc.method, tc.path, r, r.header.Get("Content-Type"))
		}
		if got := r.header.Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow %q; want %q", tc.method, tc.path, got, tc.allow)
		}
	}
	for _, path := range []string{"/", "/app.js", "/style.css", "/healthz", "/nope"} {
		r := e.do("GET", path, nil)
		csp := r.header.Get("Content-Security-Policy")
		for _, want := range []string{"frame-ancestors 'none'", "default-src 'none'", "script-src 'self'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: Content-Security-Policy %q lacks %s", path, csp, want)
			}
		}
		for h, want := range map[string]string{"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"} {
			if got := r.header.Get(h); got != want {
				t.Errorf("GET %s: %s %q; want %q", path, h, got, want)
			}
		}
	}
	// The page's script and style are its own files: the policy forbids
	// inline ones, and a page that had any would break under it.
	page := e.do("GET", "/", nil)
	e.want(page, http.StatusOK, "GET /")
	for _, inline := range []*regexp.Regexp{regexp.MustCompile(`<script>|<script [^>]*>[^<\s]`), regexp.MustCompile(`<style`), regexp.MustCompile(`\son[a-z]+=`), regexp.MustCompile(`\sstyle=`)} {
		if inline.MatchString(page.raw) {
			t.Errorf("the page has inline code the CSP forbids: %s", inline.FindString(page.raw))
		}
	}
}

// The binary: /metrics on an address of its own with -metrics-addr (and not
// on the service's), and the demo outbox on loopback with the console
// provider, which holds the code the page shows.
func TestBinaryMetricsAddrAndOutbox(t *testing.T) {
	p := startBinary(t, nil, "-metrics-addr", "127.0.0.1:0")
	metricsURL := p.stdout.await(t, regexp.MustCompile(`^sms: metrics on (http://127\.0\.0\.1:[0-9]+/metrics)$`), p.exited)[1]
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	get := func(url string) (int, string, http.Header) {
		t.Helper()
		res, err := client.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), res.Header
	}

	res, err := client.Post(p.base+"/api/sms/send", "application/json", strings.NewReader(`{"phone":"13800138000"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		t.Fatalf("send = %s", res.Status)
	}
	status, body, _ := get(metricsURL)
	if status != http.StatusOK || !strings.Contains(body, `sms_sends_total{result="sent"} 1`) {
		t.Fatalf("GET %s = %d; want 200 with the send counted:\n%s", metricsURL, status, body)
	}
	if status, body, h := get(p.base + "/metrics"); status != http.StatusNotFound || h.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /metrics on the service's address = %d %s; want a JSON 404", status, body)
	}

	var settings settings
	status, body, _ = get(p.base + "/api/sms/settings")
	if status != http.StatusOK || json.Unmarshal([]byte(body), &settings) != nil || !settings.Outbox || settings.Region != "CN" {
		t.Fatalf("settings = %d %s; want the outbox on, region CN", status, body)
	}
	code := p.stderr.await(t, regexp.MustCompile(`^sms to=\+8613800138000 text=.*code is ([0-9]{6})\b`), p.exited)[1]
	var outbox struct {
		Messages []outboxMessage `json:"messages"`
	}
	status, body, _ = get(p.base + "/api/sms/outbox")
	if status != http.StatusOK || json.Unmarshal([]byte(body), &outbox) != nil || len(outbox.Messages) != 1 ||
		outbox.Messages[0].To != number || !strings.Contains(outbox.Messages[0].Text, code) {
		t.Fatalf("outbox = %d %s; want the one message to %s, with its code %s", status, body, number, code)
	}
	p.stop(t)
}

// The outbox is served only to a console provider on loopback: the
// service refuses it for a provider that keeps none.
func TestOutboxNeedsConsole(t *testing.T) {
	cfg := testConfig()
	cfg.DemoOutbox = true
	client := testutil.Mini(t).Client(t)
	if _, err := NewService(client, cfg, &capture{}, nil); !errors.Is(err, errNoOutbox) {
		t.Fatalf("DemoOutbox with a provider that keeps no outbox: %v; want errNoOutbox", err)
	}
	if _, err := NewService(client, cfg, &ConsoleProvider{out: io.Discard}, nil); err != nil {
		t.Fatalf("DemoOutbox with the console provider: %v", err)
	}
}

// The console provider's outbox keeps the last outboxSize messages, newest
// first.
func TestConsoleOutbox(t *testing.T) {
	p := &ConsoleProvider{out: io.Discard}
	for i := range outboxSize + 5 {
		if err := p.Send(t.Context(), phoneN(i), "text"); err != nil {
			t.Fatal(err)
		}
	}
	got := p.Outbox()
	if len(got) != outboxSize || got[0].To != phoneN(outboxSize+4) || got[outboxSize-1].To != phoneN(5) {
		t.Fatalf("outbox = %v; want the last %d, newest first", got, outboxSize)
	}
}

// Waits are said in the largest unit that reads well.
func TestHumanWait(t *testing.T) {
	for s, want := range map[int64]string{1: "1 s", 59: "59 s", 60: "1 min", 61: "2 min", 2836: "48 min", 3600: "1 h", 3601: "1 h 1 min",
		7500: "2 h 5 min", 86278: "23 h 58 min", 86399: "24 h"} {
		if got := humanWait(s); got != want {
			t.Errorf("humanWait(%d) = %q; want %q", s, got, want)
		}
	}
}

// The outbox is answered to a client on this machine only: not to a request
// a proxy forwarded, whatever address it came from.
func TestOutboxNotThroughAProxy(t *testing.T) {
	b := testutil.Mini(t)
	cfg := testConfig()
	cfg.DemoOutbox = true
	svc, err := NewService(b.Client(t), cfg, &ConsoleProvider{out: io.Discard}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		remote, header, value string
		status                int
	}{
		{"127.0.0.1:5000", "", "", http.StatusOK},
		{"[::1]:5000", "", "", http.StatusOK},
		{"127.0.0.1:5000", "X-Forwarded-For", "203.0.113.7", http.StatusNotFound},
		{"127.0.0.1:5000", "Forwarded", "for=203.0.113.7", http.StatusNotFound},
		{"192.0.2.1:5000", "", "", http.StatusNotFound},
	} {
		req := httptest.NewRequest("GET", "/api/sms/outbox", nil)
		req.RemoteAddr = tc.remote
		if tc.header != "" {
			req.Header.Set(tc.header, tc.value)
		}
		w := httptest.NewRecorder()
		svc.Handler().ServeHTTP(w, req)
		if w.Code != tc.status || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("GET /api/sms/outbox from %s with %s %q = %d %s; want %d", tc.remote, tc.header, tc.value, w.Code, w.Body, tc.status)
		}
	}
}
