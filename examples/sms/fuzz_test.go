package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// Run a target for 20 s (-fuzz runs one target of one package at a time):
//
//	go test -run '^$' -fuzz '^FuzzSendRequest$' -fuzztime 20s ./examples/sms/
//	go test -run '^$' -fuzz '^FuzzVerifyRequest$' -fuzztime 20s ./examples/sms/
//
// Without -fuzz, go test runs the seeds.

// fuzzer is a service for a fuzz target, on a miniredis of its own (every
// fuzzing worker builds its own), taking client addresses from
// X-Forwarded-For, with time enough for any Redis call (a 503 would be the
// machine's load, not the input's fault).
type fuzzer struct {
	e       *env
	handler http.Handler
}

func newFuzzer(f *testing.F) *fuzzer {
	e := newEnv(f, func(c *Config) { c.TrustProxy = true; c.Timeout = 10 * time.Second })
	return &fuzzer{e: e, handler: e.svc.Handler()}
}

// seed adds the bad input cases of TestBadInput that POST to path and are
// small enough for a corpus, each with and without a forwarded address,
// and the extra bodies.
func (fz *fuzzer) seed(f *testing.F, path string, extra ...string) {
	for _, c := range badCases() {
		if c.method == "POST" && c.path == path && len(c.body) <= 2*maxBody {
			f.Add([]byte(c.body), c.contentType, "")
		}
	}
	for _, p := range payloads {
		f.Add([]byte(`{"phone":"+447400123456","code":"123456"}`), "application/json", p)
	}
	for _, b := range extra {
		for _, ct := range []string{"application/json", "application/json; charset=utf-8", "text/plain", ""} {
			f.Add([]byte(b), ct, "")
			f.Add([]byte(b), ct, "203.0.113.7, 2001:db8::1")
		}
	}
}

// serve sends one request to the handler in process (a panic fails the
// target) and fails t on a 5xx, on an answer the API does not give, or on
// a key outside the service's. It returns the status and the messages
// sent, then empties the miniredis and the provider, so that every input
// starts afresh: no limit builds up.
func (fz *fuzzer) serve(t *testing.T, path string, body []byte, contentType, xff string) (int, []message) {
	m := fz.e.b.Mini
	defer func() { // also after a failure: the next seed starts afresh
		m.FlushAll()
		fz.e.sms.mu.Lock()
		fz.e.sms.sent = nil
		fz.e.sms.mu.Unlock()
	}()
	req := httptest.NewRequest("POST", path, bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	rec := httptest.NewRecorder()
	fz.handler.ServeHTTP(rec, req)

	switch rec.Code {
	case http.StatusOK, http.StatusAccepted, http.StatusBadRequest, http.StatusUnauthorized, http.StatusUnprocessableEntity,
		http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusTooManyRequests:
	default:
		t.Fatalf("POST %s %q (Content-Type %q, X-Forwarded-For %q) = %d %s", path, body, contentType, xff, rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("POST %s %q: Content-Type %q", path, body, ct)
	}
	dec := json.NewDecoder(rec.Body)
	dec.DisallowUnknownFields()
	var r reply
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("POST %s %q: reply %v", path, body, err)
	}
	if rec.Code >= 400 && r.Error == "" {
		t.Fatalf("POST %s %q = %d without an error", path, body, rec.Code)
	}
	for _, k := range m.Keys() {
		if !keyShape.MatchString(k) {
			t.Fatalf("POST %s %q (X-Forwarded-For %q) left the key %q", path, body, xff, k)
		}
	}
	return rec.Code, fz.e.sms.messages()
}

// Any body, Content-Type and X-Forwarded-For to the send endpoint: a clear
// answer, never a 5xx or a panic, no key but the service's, and a message
// only for a 202, to the number of the body.
func FuzzSendRequest(f *testing.F) {
	fz := newFuzzer(f)
	var spellings []string
	for _, s := range ukSpellings {
		b, _ := json.Marshal(map[string]string{"phone": s})
		spellings = append(spellings, string(b))
	}
	// With a country, and numbers the policy refuses.
	spellings = append(spellings, `{"phone":"07400 123456","country":"GB"}`, `{"phone":"7400123456","country":"gb"}`,
		`{"phone":"4155552673","country":"US"}`, `{"phone":"4155552673"}`, `{"phone":"+19005550123"}`,
		`{"phone":"+881600000000"}`, `{"phone":"020 7946 0018","country":"GB"}`, `{"phone":"+447400123456","country":"XX"}`)
	fz.seed(f, "/api/sms/send", spellings...)
	f.Fuzz(func(t *testing.T, body []byte, contentType, xff string) {
		status, sent := fz.serve(t, "/api/sms/send", body, contentType, xff)
		var req struct{ Phone, Country string }
		_ = json.Unmarshal(body, &req)
		dest, err := fz.e.svc.numbers.parse(req.Phone, req.Country, fz.e.cfg.PrefixDigits)
		want := dest.E164
		switch {
		case status != http.StatusAccepted && len(sent) > 0:
			t.Fatalf("send %q = %d, and sent %v", body, status, sent)
		case status == http.StatusAccepted && (err != nil || len(sent) != 1 || sent[0].to != want):
			t.Fatalf("send %q = 202, and sent %v; want one message to %q (%v)", body, sent, want, err)
		}
	})
}

// Any body, Content-Type and X-Forwarded-For to the verify endpoint, with
// a code pending for uk (123456), so that guesses reach the comparison and
// the right one verifies: a clear answer, never a 5xx or a panic, no key
// but the service's, and a 200 only for 123456 and a spelling of uk.
func FuzzVerifyRequest(f *testing.F) {
	fz := newFuzzer(f)
	var bodies []string
	for _, s := range ukSpellings {
		for _, code := range []string{"123456", "654321"} {
			b, _ := json.Marshal(map[string]string{"phone": s, "code": code})
			bodies = append(bodies, string(b))
		}
	}
	fz.seed(f, "/api/sms/verify", bodies...)
	f.Fuzz(func(t *testing.T, body []byte, contentType, xff string) {
		if err := fz.e.svc.codes.put(context.Background(), uk, "123456", ""); err != nil {
			t.Fatal(err)
		}
		status, _ := fz.serve(t, "/api/sms/verify", body, contentType, xff)
		if status != http.StatusOK {
			return
		}
		var req struct{ Phone, Country, Code string }
		_ = json.Unmarshal(body, &req)
		if dest, err := fz.e.svc.numbers.parse(req.Phone, req.Country, fz.e.cfg.PrefixDigits); req.Code != "123456" || err != nil || dest.E164 != uk {
			t.Fatalf("verify %q = 200; want 200 only for the code 123456 of %s", body, uk)
		}
	})
}
