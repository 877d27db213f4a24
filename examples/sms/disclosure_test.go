package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// A wrong code gets one answer whether the number has a code, never had
// one, or had one that expired.
func TestEnumeration(t *testing.T) {
	e := newEnv(t)
	pending, expired, unknown := number, phoneN(1), phoneN(2)
	e.want(e.send(expired), http.StatusAccepted, "send")
	e.b.Mini.FastForward(e.cfg.CodeTTL)
	e.want(e.send(pending), http.StatusAccepted, "send")
	code := e.sms.code(t, pending)

	want := e.verify(pending, wrong(code, 0))
	e.want(want, http.StatusUnauthorized, "wrong code for a pending number")
	for _, phone := range []string{unknown, expired} {
		r := e.verify(phone, wrong(code, 0))
		if r.status != want.status || r.raw != want.raw {
			t.Errorf("wrong code for %s = %v; want %v as for a number with a code", phone, r, want)
		}
		for _, h := range []string{"Content-Type", "Cache-Control", "Retry-After"} {
			if r.header.Get(h) != want.header.Get(h) {
				t.Errorf("%s for %s = %q; want %q", h, phone, r.header.Get(h), want.header.Get(h))
			}
		}
	}
}

// Codes reach the provider and nothing else: not the responses, not the
// logs, not Redis; nor do numbers and addresses sit in Redis in clear.
func TestCodesNotDisclosed(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ProviderInFlight = 2 }) // its keys too
	var responses []response
	keep := func(r response) response { responses = append(responses, r); return r }

	e.want(keep(e.send(number)), http.StatusAccepted, "send")
	code := e.sms.code(t, number)
	e.want(keep(e.verify(number, wrong(code, 0))), http.StatusUnauthorized, "wrong code")
	stored := e.redisStrings() // while the code is stored
	e.want(keep(e.verify(number, code)), http.StatusOK, "right code")
	e.sms.fail(true)
	e.want(keep(e.send(phoneN(1))), http.StatusBadGateway, "refused send")
	stored = append(stored, e.redisStrings()...)

	codes := []string{code, e.sms.code(t, phoneN(1))}
	logs := e.logs.String()
	if !strings.Contains(logs, "code sent") || !strings.Contains(logs, "send failed") {
		t.Fatalf("logs lack the sends:\n%s", logs)
	}
	for _, c := range codes {
		if strings.Contains(logs, c) {
			t.Errorf("code %s in the logs:\n%s", c, logs)
		}
		for _, r := range responses {
			if strings.Contains(r.raw, c) || strings.Contains(fmt.Sprint(r.header), c) {
				t.Errorf("code %s in a response: %v %v", c, r, r.header)
			}
		}
		for _, s := range stored {
			if s == c { // the funnels' timestamps may hold any 6 digits
				t.Errorf("code %s stored in clear", c)
			}
		}
	}
	for _, s := range stored {
		for _, clear := range []string{"13800138000", "13900000001", "127.0.0.1"} {
			if strings.Contains(s, clear) {
				t.Errorf("%q in clear in Redis: %q", clear, s)
			}
		}
	}
	for _, clear := range []string{"13800138000", "13900000001"} {
		if strings.Contains(logs, clear) {
			t.Errorf("%q in clear in the logs:\n%s", clear, logs)
		}
	}
}

// redisStrings returns every key, hash field and value in the miniredis.
func (e *env) redisStrings() []string {
	e.t.Helper()
	m := e.b.Mini
	var out []string
	for _, k := range m.Keys() {
		out = append(out, k)
		switch typ := m.Type(k); typ {
		case "string":
			v, _ := m.Get(k)
			out = append(out, v)
		case "hash":
			fields, _ := m.HKeys(k)
			for _, f := range fields {
				out = append(out, f, m.HGet(k, f))
			}
		case "zset": // the provider semaphore's (inflight.go): tokens by time
			members, _ := m.ZMembers(k)
			out = append(out, members...)
		default:
			e.t.Fatalf("key %q of type %s: the test reads only strings, hashes and sorted sets", k, typ)
		}
	}
	return out
}
