package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Test credentials: realistic shapes, no real account.
const (
	twilioTestSID     = "AC0123456789abcdef0123456789abcdef"
	twilioTestToken   = "f0e1d2c3b4a5968778695a4b3c2d1e0f"
	twilioTestKey     = "SK00112233445566778899aabbccddeeff"
	twilioTestService = "MG89abcdef0123456789abcdef01234567"
	twilioTestFrom    = "+15017122661"
	twilioTestTo      = "+8613800138000"
	twilioTestText    = "Your verification code is 123456. It expires in 5 minutes. & ü+=%"
	twilioTestPath    = "/2010-04-01/Accounts/" + twilioTestSID + "/Messages.json"
)

// twilioCreated is Twilio's 201 answer to a message created, as its Message
// resource documents it.
func twilioCreated(to, from, body string) string {
	return fmt.Sprintf(`{"account_sid": %q, "api_version": "2010-04-01", "body": %q,
 "date_created": "Thu, 24 Aug 2023 05:01:45 +0000", "date_sent": null,
 "date_updated": "Thu, 24 Aug 2023 05:01:45 +0000", "direction": "outbound-api",
 "error_code": null, "error_message": null, "from": %q, "messaging_service_sid": null,
 "num_media": "0", "num_segments": "1", "price": null, "price_unit": "USD",
 "sid": "SMaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "status": "queued",
 "subresource_uris": {"media": "/2010-04-01/Accounts/%s/Messages/SMaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/Media.json"},
 "to": %q, "uri": "/2010-04-01/Accounts/%s/Messages/SMaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.json"}`,
		twilioTestSID, body, from, twilioTestSID, to, twilioTestSID)
}

// twilioErrorBody is Twilio's JSON answer to a refused request.
func twilioErrorBody(status, code int, message string) string {
	return fmt.Sprintf(`{"code": %d, "message": %q, "more_info": "https://www.twilio.com/docs/errors/%d", "status": %d}`,
		code, message, code, status)
}

// newTestTwilio returns a provider of cfg, with the test credentials where
// cfg has none and a From unless it has a messaging service.
func newTestTwilio(t *testing.T, cfg TwilioConfig) *Twilio {
	t.Helper()
	if cfg.AccountSID == "" {
		cfg.AccountSID = twilioTestSID
	}
	if cfg.AuthToken == "" {
		cfg.AuthToken = twilioTestToken
	}
	if cfg.From == "" && cfg.MessagingServiceSID == "" {
		cfg.From = twilioTestFrom
	}
	tw, err := NewTwilio(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tw
}

// twilioServer serves h and counts its requests; both end with the test.
func twilioServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// twilioAnswer returns a handler that answers status and body as JSON.
func twilioAnswer(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if body != "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// The request is Twilio's Messages create as documented: POST to the
// account's Messages.json, basic auth, a form of To, Body and From (or
// MessagingServiceSid) and nothing else; a 201 with a sid is a success.
func TestTwilioSendRequest(t *testing.T) {
	for _, tc := range []struct {
		name     string
		base     string // "" : the server's URL; else a suffix to it
		cfg      TwilioConfig
		user     string
		prefix   string
		wantForm url.Values
	}{
		{
			name: "from", cfg: TwilioConfig{From: twilioTestFrom}, user: twilioTestSID,
			wantForm: url.Values{"To": {twilioTestTo}, "Body": {twilioTestText}, "From": {twilioTestFrom}},
		},
		{
			name: "alphanumeric sender", cfg: TwilioConfig{From: "Funnel Go"}, user: twilioTestSID,
			wantForm: url.Values{"To": {twilioTestTo}, "Body": {twilioTestText}, "From": {"Funnel Go"}},
		},
		{
			name: "messaging service", cfg: TwilioConfig{MessagingServiceSID: twilioTestService}, user: twilioTestSID,
			wantForm: url.Values{"To": {twilioTestTo}, "Body": {twilioTestText}, "MessagingServiceSid": {twilioTestService}},
		},
		{
			name: "API key", cfg: TwilioConfig{From: twilioTestFrom, APIKeySID: twilioTestKey}, user: twilioTestKey,
			wantForm: url.Values{"To": {twilioTestTo}, "Body": {twilioTestText}, "From": {twilioTestFrom}},
		},
		{
			name: "status callback", cfg: TwilioConfig{From: twilioTestFrom, StatusCallback: "https://sms.example" + reportPath}, user: twilioTestSID,
			wantForm: url.Values{"To": {twilioTestTo}, "Body": {twilioTestText}, "From": {twilioTestFrom}, "StatusCallback": {"https://sms.example" + reportPath}},
		},
		{
			name: "base URL with a path and a trailing slash", base: "/proxy/twilio/", prefix: "/proxy/twilio",
			cfg: TwilioConfig{From: twilioTestFrom}, user: twilioTestSID,
			wantForm: url.Values{"To": {twilioTestTo}, "Body": {twilioTestText}, "From": {twilioTestFrom}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var problems []string
			bad := func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				problems = append(problems, fmt.Sprintf(format, args...))
			}
			srv, n := twilioServer(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost {
					bad("method %s, want POST", r.Method)
				}
				if want := tc.prefix + twilioTestPath; r.URL.Path != want || r.URL.RawQuery != "" {
					bad("URL %s, want path %s and no query", r.URL, want)
				}
				if user, pass, ok := r.BasicAuth(); !ok || user != tc.user || pass != twilioTestToken {
					bad("basic auth %q:%q (%v), want %q and the token", user, pass, ok, tc.user)
				}
				if ct := r.Header.Get("Content-Type"); ct != "application/x-www-form-urlencoded" {
					bad("Content-Type %q", ct)
				}
				raw, err := io.ReadAll(r.Body)
				if err != nil {
					bad("reading the body: %v", err)
				}
				form, err := url.ParseQuery(string(raw))
				if err != nil {
					bad("body %q is not a form: %v", raw, err)
				}
				if !reflect.DeepEqual(form, tc.wantForm) {
					bad("form %v, want exactly %v", form, tc.wantForm)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, twilioCreated(form.Get("To"), form.Get("From"), form.Get("Body")))
			})
			cfg := tc.cfg
			cfg.BaseURL = srv.URL + tc.base
			tw := newTestTwilio(t, cfg)
			if err := tw.Send(context.Background(), twilioTestTo, twilioTestText); err != nil {
				t.Fatalf("Send: %v", err)
			}
			if got := n.Load(); got != 1 {
				t.Errorf("the server saw %d requests, want 1", got)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, p := range problems {
				t.Error(p)
			}
		})
	}
}

// Every answer but a success is an error; it matches ErrDestinationRefused
// (the service answers 422) only when Twilio refused the To number itself,
// and no other (502): our credentials, sender, rate, Twilio's failures.
func TestTwilioSendErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  int
		body    string
		refused bool
		code    int // the TwilioError's Code; -1: not a TwilioError
	}{
		// Refusals of the destination, bodies as Twilio answers them.
		{"21211 invalid To", 400, twilioErrorBody(400, 21211, "Invalid 'To' Phone Number: +86138001XXXXX"), true, 21211},
		{"21211 invalid To, older text", 400, twilioErrorBody(400, 21211, "The 'To' number +8613800138000 is not a valid phone number."), true, 21211},
		{"21214 To cannot be reached", 400, twilioErrorBody(400, 21214, "'To' phone number cannot be reached"), true, 21214},
		{"21217 not a valid number", 400, twilioErrorBody(400, 21217, "Phone number does not appear to be valid"), true, 21217},
		{"21265 To is a short code", 400, twilioErrorBody(400, 21265, "'To' number cannot be a Short Code: 12345"), true, 21265},
		{"21266 To is our From", 400, twilioErrorBody(400, 21266, "'To' and 'From' number cannot be the same: +15017122661"), true, 21266},
		{"21268 premium rate", 400, twilioErrorBody(400, 21268, "Sending to Premium rate or Information Service numbers is not allowed"), true, 21268},
		{"21408 region not enabled", 400, twilioErrorBody(400, 21408, "Permission to send an SMS has not been enabled for the region indicated by the 'To' number: +8613800138000."), true, 21408},
		{"21610 unsubscribed", 400, twilioErrorBody(400, 21610, "Attempt to send to unsubscribed recipient"), true, 21610},
		{"21612 not reachable", 400, twilioErrorBody(400, 21612, "The 'To' phone number: +8613800138000, is not currently reachable using the 'From' phone number: +15017122661 via SMS."), true, 21612},
		{"21614 not a mobile", 400, twilioErrorBody(400, 21614, "To number: +8613800138000, is not a mobile number"), true, 21614},
		{"21635 landline", 400, twilioErrorBody(400, 21635, "'To' number cannot be a landline"), true, 21635},

		// Everything else.
		{"500 HTML", 500, "<html><body><h1>500 Internal Server Error</h1></body></html>", false, 0},
		{"502 empty", 502, "", false, 0},
		{"503 empty", 503, "", false, 0},
		{"503 HTML", 503, "<html><head><title>503 Service Temporarily Unavailable</title></head></html>", false, 0},
		{"500 with a refusal's code", 500, twilioErrorBody(500, 21211, "Invalid 'To' Phone Number"), false, 21211},
		{"401 20003 credentials", 401, `{"code": 20003, "detail": "Your AccountSid or AuthToken was incorrect.", "message": "Authentication Error - invalid username", "more_info": "https://www.twilio.com/docs/errors/20003", "status": 401}`, false, 20003},
		{"404 20404 no such account", 404, twilioErrorBody(404, 20404, "The requested resource /2010-04-01/Accounts/"+twilioTestSID+"/Messages.json was not found"), false, 20404},
		{"429 20429 rate", 429, twilioErrorBody(429, 20429, "Too Many Requests"), false, 20429},
		{"400 21606 From not ours", 400, twilioErrorBody(400, 21606, "The From phone number +15017122661 is not a valid, SMS-capable inbound phone number or short code for your account."), false, 21606},
		{"400 21659 From not a Twilio number", 400, twilioErrorBody(400, 21659, "'From' +15017122661 is not a Twilio phone number or Short Code country mismatch"), false, 21659},
		{"400 21401 From not SMS-enabled", 400, twilioErrorBody(400, 21401, "Invalid Phone Number"), false, 21401},
		{"400 21407 number type without SMS", 400, twilioErrorBody(400, 21407, "This Phone Number type does not support SMS"), false, 21407},
		{"400 21608 trial account", 400, twilioErrorBody(400, 21608, "The number +8613800138000 is unverified. Trial accounts cannot send messages to unverified numbers"), false, 21608},
		{"400 not JSON", 400, "Bad Request", false, 0},
		{"400 JSON without a code", 400, `{"message": "Bad Request"}`, false, 0},
		{"400 truncated JSON", 400, `{"code": 21211, "message": "Invalid`, false, 0},
		{"201 without a sid", 201, `{"status": "queued"}`, false, -1},
		{"200 HTML", 200, "<html><body>Welcome</body></html>", false, -1},
		{"204 empty", 204, "", false, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, n := twilioServer(t, twilioAnswer(tc.status, tc.body))
			tw := newTestTwilio(t, TwilioConfig{BaseURL: srv.URL})
			err := tw.Send(context.Background(), twilioTestTo, twilioTestText)
			if err == nil {
				t.Fatalf("HTTP %d %s: Send returned nil", tc.status, tc.body)
			}
			if got := errors.Is(err, ErrDestinationRefused); got != tc.refused {
				t.Errorf("errors.Is(%v, ErrDestinationRefused) = %v, want %v", err, got, tc.refused)
			}
			var te *TwilioError
			switch {
			case tc.code < 0:
				if errors.As(err, &te) {
					t.Errorf("a 2xx without a sid gave a TwilioError: %v", err)
				}
			case !errors.As(err, &te):
				t.Errorf("%v (%T) is not a *TwilioError", err, err)
			case te.Status != tc.status || te.Code != tc.code:
				t.Errorf("TwilioError Status %d, Code %d; want %d, %d", te.Status, te.Code, tc.status, tc.code)
			case tc.code != 0 && te.MoreInfo != fmt.Sprintf("https://www.twilio.com/docs/errors/%d", tc.code):
				t.Errorf("MoreInfo %q", te.MoreInfo)
			}
			if msg := err.Error(); strings.Contains(msg, twilioTestTo) || strings.Contains(msg, twilioTestTo[1:]) {
				t.Errorf("the error holds the recipient's number: %s", msg)
			}
			if got := n.Load(); got != 1 {
				t.Errorf("the server saw %d requests, want 1 (no retry)", got)
			}
		})
	}
}

// A TwilioError's text says what Twilio said, and Unwrap gives the refusal
// only for a destination code in a 4xx.
func TestTwilioErrorText(t *testing.T) {
	e := &TwilioError{Status: 400, Code: 21614, Message: "To number: [To], is not a mobile number", MoreInfo: "https://www.twilio.com/docs/errors/21614"}
	want := "twilio: HTTP 400 Bad Request: error 21614: To number: [To], is not a mobile number (https://www.twilio.com/docs/errors/21614)"
	if e.Error() != want {
		t.Errorf("Error() = %q, want %q", e.Error(), want)
	}
	if e.Unwrap() != ErrDestinationRefused {
		t.Errorf("Unwrap() = %v, want ErrDestinationRefused", e.Unwrap())
	}
	if got := (&TwilioError{Status: 503}).Error(); got != "twilio: HTTP 503 Service Unavailable" {
		t.Errorf("Error() = %q", got)
	}
	if got := (&TwilioError{Status: 401, Code: 20003}).Unwrap(); got != nil {
		t.Errorf("Unwrap() of 20003 = %v, want nil", got)
	}
}

// An error answer's body is read up to 64 KiB only: a huge one is not
// parsed (and does not fill memory or the log).
func TestTwilioSendBodyLimit(t *testing.T) {
	body := strings.Repeat(" ", 1<<20) + twilioErrorBody(400, 21211, "Invalid 'To' Phone Number")
	srv, _ := twilioServer(t, twilioAnswer(400, body))
	tw := newTestTwilio(t, TwilioConfig{BaseURL: srv.URL})
	err := tw.Send(context.Background(), twilioTestTo, twilioTestText)
	var te *TwilioError
	if !errors.As(err, &te) || te.Code != 0 {
		t.Fatalf("Send = %v; want a TwilioError without a code (body beyond the 64 KiB read)", err)
	}
	if errors.Is(err, ErrDestinationRefused) {
		t.Errorf("%v matches ErrDestinationRefused", err)
	}

	long := twilioErrorBody(400, 21211, strings.Repeat("x", 30000))
	srv2, _ := twilioServer(t, twilioAnswer(400, long))
	tw2 := newTestTwilio(t, TwilioConfig{BaseURL: srv2.URL})
	if err := tw2.Send(context.Background(), twilioTestTo, twilioTestText); err == nil || len(err.Error()) > 1024 {
		t.Errorf("Send = an error of %d bytes; want one under 1 KiB", len(fmt.Sprint(err)))
	}
}

// A Twilio that does not answer: Send returns when its context ends, with an
// error that matches the context's and is no refusal.
func TestTwilioSendHung(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers bool // the server sends 201 and its headers, then hangs in the body
		cancel  bool // cancel the context instead of its deadline
		want    error
	}{
		{name: "no answer, deadline", want: context.DeadlineExceeded},
		{name: "no answer, cancel", cancel: true, want: context.Canceled},
		{name: "hung body, deadline", headers: true, want: context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			arrived := make(chan struct{}, 1)
			srv, _ := twilioServer(t, func(w http.ResponseWriter, r *http.Request) {
				if tc.headers {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated)
					_, _ = io.WriteString(w, `{"sid": "SMaaaaaaaa`)
					w.(http.Flusher).Flush()
				}
				arrived <- struct{}{}
				select {
				case <-r.Context().Done():
				case <-release:
				}
			})
			t.Cleanup(func() { close(release) }) // before srv.Close, which waits for handlers
			tw := newTestTwilio(t, TwilioConfig{BaseURL: srv.URL})

			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if tc.cancel {
				ctx, cancel = context.WithCancel(context.Background())
				defer cancel()
				go func() {
					select {
					case <-arrived:
						cancel()
					case <-release:
					}
				}()
			}
			done := make(chan error, 1)
			go func() { done <- tw.Send(ctx, twilioTestTo, twilioTestText) }()
			select {
			case err := <-done:
				if !errors.Is(err, tc.want) {
					t.Errorf("Send = %v; want an error matching %v", err, tc.want)
				}
				if errors.Is(err, ErrDestinationRefused) {
					t.Errorf("Send = %v, a refusal", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Send still running 10 s after its context ended")
			}
		})
	}
}

// Config validation: every invalid config is an errTwilioConfig, none
// panics, and the error never quotes the token.
func TestTwilioConfig(t *testing.T) {
	valid := TwilioConfig{AccountSID: twilioTestSID, AuthToken: twilioTestToken, From: twilioTestFrom}
	with := func(f func(*TwilioConfig)) TwilioConfig {
		c := valid
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  TwilioConfig
	}{
		{"zero", TwilioConfig{}},
		{"no account SID", with(func(c *TwilioConfig) { c.AccountSID = "" })},
		{"account SID too short", with(func(c *TwilioConfig) { c.AccountSID = twilioTestSID[:33] })},
		{"account SID too long", with(func(c *TwilioConfig) { c.AccountSID = twilioTestSID + "0" })},
		{"account SID not hex", with(func(c *TwilioConfig) { c.AccountSID = "AC0123456789abcdef0123456789abcdeg" })},
		{"account SID of another kind", with(func(c *TwilioConfig) { c.AccountSID = "SK" + twilioTestSID[2:] })},
		{"account SID is the token", with(func(c *TwilioConfig) { c.AccountSID = twilioTestToken })},
		{"no token", with(func(c *TwilioConfig) { c.AuthToken = "" })},
		{"token with a newline", with(func(c *TwilioConfig) { c.AuthToken = twilioTestToken + "\n" })},
		{"token with a space", with(func(c *TwilioConfig) { c.AuthToken = " " + twilioTestToken })},
		{"API key SID bad", with(func(c *TwilioConfig) { c.APIKeySID = "SK123" })},
		{"API key SID is an account SID", with(func(c *TwilioConfig) { c.APIKeySID = twilioTestSID })},
		{"neither From nor service", with(func(c *TwilioConfig) { c.From = "" })},
		{"both From and service", with(func(c *TwilioConfig) { c.MessagingServiceSID = twilioTestService })},
		{"service SID bad", with(func(c *TwilioConfig) { c.From, c.MessagingServiceSID = "", "MG123" })},
		{"service SID of another kind", with(func(c *TwilioConfig) { c.From, c.MessagingServiceSID = "", twilioTestSID })},
		{"From without plus", with(func(c *TwilioConfig) { c.From = "15017122661" })},
		{"From +0", with(func(c *TwilioConfig) { c.From = "+05017122661" })},
		{"From too long", with(func(c *TwilioConfig) { c.From = "+1501712266112345" })},
		{"From with spaces", with(func(c *TwilioConfig) { c.From = "+1 501 712 2661" })},
		{"From plus only", with(func(c *TwilioConfig) { c.From = "+" })},
		{"sender ID too long", with(func(c *TwilioConfig) { c.From = "FunnelGuard1" })},
		{"sender ID without a letter", with(func(c *TwilioConfig) { c.From = "12345 67" })},
		{"sender ID with a bad character", with(func(c *TwilioConfig) { c.From = "Funnel!" })},
		{"sender ID not ASCII", with(func(c *TwilioConfig) { c.From = "Fünnel" })},
		{"base URL not http", with(func(c *TwilioConfig) { c.BaseURL = "ftp://api.twilio.com" })},
		{"base URL without scheme", with(func(c *TwilioConfig) { c.BaseURL = "api.twilio.com" })},
		{"base URL without host", with(func(c *TwilioConfig) { c.BaseURL = "https://" })},
		{"base URL opaque", with(func(c *TwilioConfig) { c.BaseURL = "https:api.twilio.com" })},
		{"base URL with a query", with(func(c *TwilioConfig) { c.BaseURL = "https://api.twilio.com/?x=1" })},
		{"base URL with an empty query", with(func(c *TwilioConfig) { c.BaseURL = "https://api.twilio.com?" })},
		{"base URL with a fragment", with(func(c *TwilioConfig) { c.BaseURL = "https://api.twilio.com/#x" })},
		{"base URL with credentials", with(func(c *TwilioConfig) {
			c.BaseURL = "https://" + twilioTestSID + ":" + twilioTestToken + "@api.twilio.com"
		})},
		{"base URL that does not parse", with(func(c *TwilioConfig) { c.BaseURL = "https://a:" + twilioTestToken + "@api twilio.com/%zz" })},
		{"http base URL to a remote host", with(func(c *TwilioConfig) { c.BaseURL = "http://api.twilio.com" })},
		{"http base URL to a private address", with(func(c *TwilioConfig) { c.BaseURL = "http://10.0.0.1:8080" })},
		{"http base URL to a name like localhost", with(func(c *TwilioConfig) { c.BaseURL = "http://localhost.example.com" })},
		{"http base URL to a name like 127.0.0.1", with(func(c *TwilioConfig) { c.BaseURL = "http://127.0.0.1.nip.io" })},
		{"http base URL to all addresses", with(func(c *TwilioConfig) { c.BaseURL = "http://0.0.0.0:8081" })},
		{"status callback without a host", with(func(c *TwilioConfig) { c.StatusCallback = "https:///x" })},
		{"status callback not http", with(func(c *TwilioConfig) { c.StatusCallback = "ftp://sms.example/x" })},
		{"status callback with a query", with(func(c *TwilioConfig) { c.StatusCallback = "https://sms.example/?a=1" + reportPath })},
		{"status callback with an API key", with(func(c *TwilioConfig) {
			c.StatusCallback, c.APIKeySID = "https://sms.example"+reportPath, twilioTestKey
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tw, err := NewTwilio(tc.cfg)
			if !errors.Is(err, errTwilioConfig) || tw != nil {
				t.Fatalf("NewTwilio = %v, %v; want nil, an errTwilioConfig", tw, err)
			}
			if strings.Contains(err.Error(), twilioTestToken) {
				t.Errorf("the error quotes the token: %v", err)
			}
			// For the person running the service: what to set, not Go's names.
			if !strings.Contains(err.Error(), "TWILIO_") && !strings.Contains(err.Error(), "SMS_PUBLIC_URL") {
				t.Errorf("the error names no environment variable: %v", err)
			}
			for _, field := range []string{"AccountSID", "AuthToken", "APIKeySID", "MessagingServiceSID", "BaseURL", "StatusCallback", "From "} {
				if strings.Contains(err.Error(), field) {
					t.Errorf("the error names the Go field %s: %v", field, err)
				}
			}
		})
	}

	for _, tc := range []struct {
		name string
		cfg  TwilioConfig
	}{
		{"From E.164", valid},
		{"upper-case hex", with(func(c *TwilioConfig) { c.AccountSID = "AC" + strings.ToUpper(twilioTestSID[2:]) })},
		{"sender ID", with(func(c *TwilioConfig) { c.From = "FunnelGuard" })},
		{"sender ID with signs", with(func(c *TwilioConfig) { c.From = "A&B +-_ 1" })},
		{"service", with(func(c *TwilioConfig) { c.From, c.MessagingServiceSID = "", twilioTestService })},
		{"API key", with(func(c *TwilioConfig) { c.APIKeySID = twilioTestKey })},
		{"http base URL", with(func(c *TwilioConfig) { c.BaseURL = "http://127.0.0.1:8081" })},
		{"http base URL to 127.1.2.3", with(func(c *TwilioConfig) { c.BaseURL = "http://127.1.2.3:8081/twilio" })},
		{"http base URL to ::1", with(func(c *TwilioConfig) { c.BaseURL = "http://[::1]:8081" })},
		{"http base URL to localhost", with(func(c *TwilioConfig) { c.BaseURL = "http://LocalHost:8081" })},
		{"status callback", with(func(c *TwilioConfig) { c.StatusCallback = "https://sms.example" + reportPath })},
		{"http status callback", with(func(c *TwilioConfig) { c.StatusCallback = "http://sms.example:8080" + reportPath })},
		{"base URL with a slash", with(func(c *TwilioConfig) { c.BaseURL = "https://api.twilio.com/" })},
		{"base URL with a path", with(func(c *TwilioConfig) { c.BaseURL = "https://proxy.example/twilio" })},
	} {
		t.Run("valid "+tc.name, func(t *testing.T) {
			if _, err := NewTwilio(tc.cfg); err != nil {
				t.Errorf("NewTwilio: %v", err)
			}
		})
	}
}

// Configuration errors say what to set, in the environment or with a flag,
// and quote a base URL as given, not URL-escaped.
func TestTwilioConfigErrors(t *testing.T) {
	valid := TwilioConfig{AccountSID: twilioTestSID, AuthToken: twilioTestToken, From: twilioTestFrom}
	for _, tc := range []struct {
		name string
		f    func(*TwilioConfig)
		want string // the whole error
	}{
		{"no account SID", func(c *TwilioConfig) { c.AccountSID = "" },
			"invalid Twilio configuration: set TWILIO_ACCOUNT_SID (or -twilio-account-sid): it must be AC followed by 32 hex digits"},
		{"no token", func(c *TwilioConfig) { c.AuthToken = "" },
			"invalid Twilio configuration: set TWILIO_AUTH_TOKEN: the account's auth token, or with TWILIO_API_KEY_SID (or -twilio-api-key-sid) the API key's secret"},
		{"no sender", func(c *TwilioConfig) { c.From = "" },
			"invalid Twilio configuration: set exactly one of TWILIO_FROM (or -twilio-from) and TWILIO_MESSAGING_SERVICE_SID (or -twilio-messaging-service-sid)"},
		{"scheme", func(c *TwilioConfig) { c.BaseURL = "ftp://api.twilio.com/a b/ü" },
			`invalid Twilio configuration: TWILIO_API_URL (or -twilio-url): "ftp://api.twilio.com/a b/ü": the scheme must be https (or http to a loopback host)`},
		{"http to a remote host", func(c *TwilioConfig) { c.BaseURL = "http://api.twilio.com/a b" },
			`invalid Twilio configuration: TWILIO_API_URL (or -twilio-url): "http://api.twilio.com/a b": http only to a loopback host ` +
				`(127.0.0.0/8, ::1, localhost), since basic authentication would cross the network in clear text: use https`},
		{"credentials", func(c *TwilioConfig) { c.BaseURL = "https://user:pw@api.twilio.com" },
			"invalid Twilio configuration: TWILIO_API_URL (or -twilio-url): holds credentials (not repeated): " +
				"put them in TWILIO_ACCOUNT_SID (or -twilio-account-sid) and TWILIO_AUTH_TOKEN"},
		{"the token in a query", func(c *TwilioConfig) { c.BaseURL = "https://api.twilio.com/?t=" + twilioTestToken },
			`invalid Twilio configuration: TWILIO_API_URL (or -twilio-url): "https://api.twilio.com/?t=[secret]" has a query or a fragment`},
		{"status callback", func(c *TwilioConfig) { c.StatusCallback = "ftp://sms.example" + reportPath },
			`invalid Twilio configuration: SMS_PUBLIC_URL (or -public-url): "ftp://sms.example` + reportPath + `": the scheme must be http or https`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid
			tc.f(&c)
			if _, err := NewTwilio(c); err == nil || err.Error() != tc.want {
				t.Errorf("NewTwilio = %v\nwant %s", err, tc.want)
			}
		})
	}
}

// The HTTP client: by default one with a 10 s timeout, or Timeout; a given
// one is copied, not changed, and neither follows redirects.
func TestTwilioHTTPClient(t *testing.T) {
	tw := newTestTwilio(t, TwilioConfig{})
	if tw.client.Timeout != 10*time.Second {
		t.Errorf("default client timeout %v, want 10s", tw.client.Timeout)
	}
	if tw := newTestTwilio(t, TwilioConfig{Timeout: 3 * time.Second}); tw.client.Timeout != 3*time.Second {
		t.Errorf("client timeout %v, want Timeout, 3s", tw.client.Timeout)
	}
	if tw.client.CheckRedirect == nil {
		t.Error("the default client follows redirects")
	}
	mine := &http.Client{Timeout: time.Second}
	tw = newTestTwilio(t, TwilioConfig{HTTPClient: mine})
	if mine.CheckRedirect != nil {
		t.Error("NewTwilio changed the given client")
	}
	if tw.client == mine || tw.client.Timeout != time.Second || tw.client.CheckRedirect == nil {
		t.Errorf("client %+v: want a copy of the given one that does not follow redirects", tw.client)
	}
}

// The token is in no error: not in an error answer's (even one that echoes
// it), not in a transport error's, not in a config error's (see
// TestTwilioConfig).
func TestTwilioTokenNotInErrors(t *testing.T) {
	for _, key := range []string{"", twilioTestKey} {
		echo, _ := twilioServer(t, func(w http.ResponseWriter, r *http.Request) {
			user, pass, _ := r.BasicAuth()
			twilioAnswer(401, twilioErrorBody(401, 20003, "Authentication Error - invalid username "+user+" password "+pass))(w, r)
		})
		plain, _ := twilioServer(t, twilioAnswer(401, twilioErrorBody(401, 20003, "Authentication Error - invalid username")))
		closed := httptest.NewServer(http.NotFoundHandler())
		closed.Close() // connection refused
		for _, base := range []string{echo.URL, plain.URL, closed.URL} {
			tw := newTestTwilio(t, TwilioConfig{BaseURL: base, APIKeySID: key})
			err := tw.Send(context.Background(), twilioTestTo, twilioTestText)
			if err == nil {
				t.Fatalf("%s: Send returned nil", base)
			}
			if strings.Contains(err.Error(), twilioTestToken) {
				t.Errorf("the error holds the token: %v", err)
			}
			if errors.Is(err, ErrDestinationRefused) {
				t.Errorf("%v matches ErrDestinationRefused", err)
			}
		}
	}
}

// A redirect is an error, and not followed: the credentials go nowhere else.
func TestTwilioNoRedirect(t *testing.T) {
	for _, status := range []int{301, 302, 303, 307, 308} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			other, otherN := twilioServer(t, twilioAnswer(201, twilioCreated(twilioTestTo, twilioTestFrom, twilioTestText)))
			srv, _ := twilioServer(t, func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, other.URL+r.URL.Path, status)
			})
			tw := newTestTwilio(t, TwilioConfig{BaseURL: srv.URL})
			err := tw.Send(context.Background(), twilioTestTo, twilioTestText)
			if err == nil || errors.Is(err, ErrDestinationRefused) {
				t.Errorf("Send = %v; want an error, not a refusal", err)
			}
			var te *TwilioError
			if !errors.As(err, &te) || te.Status != status {
				t.Errorf("Send = %v; want a TwilioError of status %d", err, status)
			}
			if n := otherN.Load(); n != 0 {
				t.Errorf("the redirect's target saw %d requests", n)
			}
		})
	}
}

// The flags default to their environment variables and win over them; the
// auth token comes from the environment only; -public-url sets the status
// callback at reportPath.
func TestTwilioFlags(t *testing.T) {
	env := map[string]string{
		"TWILIO_ACCOUNT_SID":           twilioTestSID,
		"TWILIO_AUTH_TOKEN":            twilioTestToken,
		"TWILIO_API_KEY_SID":           twilioTestKey,
		"TWILIO_FROM":                  twilioTestFrom,
		"TWILIO_MESSAGING_SERVICE_SID": twilioTestService,
		"TWILIO_API_URL":               "http://env.example",
		"SMS_PUBLIC_URL":               "https://sms.example/",
	}
	parse := func(getenv func(string) string, args ...string) TwilioConfig {
		t.Helper()
		fl := flag.NewFlagSet("sms", flag.ContinueOnError)
		cfg := twilioFlags(fl, getenv)
		if err := fl.Parse(args); err != nil {
			t.Fatal(err)
		}
		return cfg()
	}
	want := TwilioConfig{
		BaseURL: "http://env.example", AccountSID: twilioTestSID, AuthToken: twilioTestToken,
		APIKeySID: twilioTestKey, From: twilioTestFrom, MessagingServiceSID: twilioTestService,
		StatusCallback: "https://sms.example" + reportPath,
	}
	if got := parse(func(k string) string { return env[k] }); !reflect.DeepEqual(got, want) {
		t.Errorf("twilioFlags of the environment = %+v, want %+v", got, want)
	}
	const other = "AC" + "ffffffffffffffffffffffffffffffff"
	want.BaseURL, want.AccountSID, want.APIKeySID, want.From, want.MessagingServiceSID, want.StatusCallback =
		"http://flag.example", other, "", "Funnel", "", "https://flag.example/sms"+reportPath
	got := parse(func(k string) string { return env[k] }, "-twilio-url", "http://flag.example", "-twilio-account-sid", other,
		"-twilio-api-key-sid", "", "-twilio-from", "Funnel", "-twilio-messaging-service-sid", "", "-public-url", "https://flag.example/sms")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("twilioFlags with flags = %+v, want %+v", got, want)
	}
	if got := parse(func(string) string { return "" }); !reflect.DeepEqual(got, TwilioConfig{}) {
		t.Errorf("twilioFlags of an empty environment = %+v", got)
	}
	fl := flag.NewFlagSet("sms", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	twilioFlags(fl, func(string) string { return "" })
	if err := fl.Parse([]string{"-twilio-auth-token", twilioTestToken}); err == nil {
		t.Error("-twilio-auth-token is a flag: a secret in every process listing")
	}
}

// onPrice takes the price Twilio reports: in the create reply when it has
// one, in a genuine status callback's Price and PriceUnit, never from an
// unsigned report, a null price or one that is not an amount.
func TestTwilioOnPrice(t *testing.T) {
	type got struct {
		to, unit string
		price    micros
	}
	created := func(price string) string {
		return strings.Replace(twilioCreated(number, twilioTestFrom, "x"), `"price": null`, `"price": `+price, 1)
	}
	for _, tc := range []struct {
		name, answer string
		want         []got
	}{
		{"null", created("null"), nil},
		{"charged", created(`"-0.07850"`), []got{{number, "USD", 78_500}}},
		{"not an amount", created(`"-0.0785x"`), nil},
	} {
		t.Run("create "+tc.name, func(t *testing.T) {
			srv, _ := twilioServer(t, twilioAnswer(201, tc.answer))
			tw := newTestTwilio(t, TwilioConfig{BaseURL: srv.URL})
			var seen []got
			tw.onPrice = func(to, unit string, p micros) { seen = append(seen, got{to, unit, p}) }
			if err := tw.Send(context.Background(), number, "x"); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(seen, tc.want) {
				t.Fatalf("onPrice got %v; want %v", seen, tc.want)
			}
		})
	}
	const callback = "https://sms.example/api/sms/delivery-report"
	for _, tc := range []struct {
		name   string
		form   url.Values
		signed bool
		want   []got
	}{
		{"report with a price", url.Values{"Price": {"-0.30"}, "PriceUnit": {"EUR"}}, true, []got{{number, "EUR", 300_000}}},
		{"report without", url.Values{}, true, nil},
		{"report with an empty price", url.Values{"Price": {""}, "PriceUnit": {"USD"}}, true, nil},
		{"unsigned report", url.Values{"Price": {"-0.30"}, "PriceUnit": {"EUR"}}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tw := newTestTwilio(t, TwilioConfig{StatusCallback: callback})
			var seen []got
			tw.onPrice = func(to, unit string, p micros) { seen = append(seen, got{to, unit, p}) }
			form := url.Values{"MessageSid": {"SM" + strings.Repeat("a", 32)}, "MessageStatus": {"delivered"}, "To": {number}}
			for k, v := range tc.form {
				form[k] = v
			}
			sig := "forged"
			if tc.signed {
				sig = twilioSignature(twilioTestToken, callback, form)
			}
			_, err := tw.Report(reportRequest(callback, form, sig))
			if tc.signed != (err == nil) {
				t.Fatalf("Report: %v", err)
			}
			if !slices.Equal(seen, tc.want) {
				t.Fatalf("onPrice got %v; want %v", seen, tc.want)
			}
		})
	}
}
