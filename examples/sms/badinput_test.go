package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

// uk is the number the spelling tests write in many ways, in E.164.
const uk = "+447400123456"

// ukSpellings are ways of writing uk that the service accepts (region CN,
// whose international prefix is 00).
var ukSpellings = []string{
	"+44 7400 123456",
	"+447400123456",
	"0044 7400 123456",
	"+44-7400-123456",
	"+44.7400.123456",
	"+44 (7400) 123456",
	"+44 (0)7400 123456",
	"+44 7400-123.456",
	"＋４４ ７４００ １２３４５６",
	"＋４４７４００１２３４５６",
	"＋４４－７４００－１２３４５６",
	"+44\u00a07400\u00a0123456",
	"+44\u30007400\u3000123456",
	"+44 7400 12345６",
}

// payloads are strings that are neither a phone number nor a code: control
// characters, braces, glob characters, colons and Lua, alone and around a
// valid number. They are the phone numbers, codes and bodies of the bad
// input tests and seeds of the fuzz targets.
var payloads = []string{
	"", " ", "\x00", "\x00+447400123456", "+447400123456\x00", "+44 7400\x00 123456",
	"\r\n", "\r\n+447400123456", "+447400123456\r\n", "+447400123456\r\nX-Injected: 1", "+44\n7400123456", "\t+447400123456",
	"{", "}", "{}", "}{", "a{b}c", "{+447400123456}", "a{b}c+447400123456", "}{+447400123456", "+44{7400}123456",
	"*", "?", "[", "]", "[]", "*?[]", "+447400123456*", "+44740012345?", "[+447400123456]", "+44[7400]123456",
	":", "+44:7400123456", "sms:code:*", "sms:phone:{m:x}:funnel",
	"redis.call('FLUSHALL')", "+447400123456 redis.call('FLUSHALL')", "'); redis.call('FLUSHALL') --",
	"]] redis.call('FLUSHALL') --[[", "return redis.call('KEYS', '*')",
	"tel:+44-7400-123456", "+44 7400 123456 ext. 12", "+1-800-FLOWERS", "\xff\xfe", "\u200b+447400123456",
	"+447400123456\u202e", "%2B447400123456", "+447400123456/2", "+447400123456;+8613800138000",
}

// Every spelling of one number counts against one per-number limit: five
// codes in an hour, each to another spelling, and every spelling is refused
// by the hourly rule after them.
func TestSpellingsShareOneBucket(t *testing.T) {
	e := newEnv(t, noIPLimits)
	const gap = 61 * time.Second // past the cooldown
	for i, s := range ukSpellings[:5] {
		e.at(time.Duration(i) * gap)
		e.want(e.send(s), http.StatusAccepted, fmt.Sprintf("send %d to %q", i+1, s))
	}
	e.at(5 * gap)
	for _, s := range ukSpellings {
		e.want(e.send(s), http.StatusTooManyRequests, fmt.Sprintf("a 6th send in the hour, to %q", s))
	}
	if got, want := e.denials("phone", "hourly"), float64(len(ukSpellings)); got != want {
		t.Errorf("hourly denials = %v; want %v", got, want)
	}
	for _, m := range e.sms.messages() {
		if m.to != uk {
			t.Errorf("message to %q; want %s", m.to, uk)
		}
	}
	ctx := context.Background()
	if keys, err := e.svc.client.Keys(ctx, "sms:phone:*").Result(); err != nil || len(testutil.WithoutRecords(keys)) != 1 {
		t.Fatalf("per-number state keys = %q (%v); want one", keys, err)
	}
}

// A code sent to one spelling verifies from another.
func TestSpellingsShareOneCode(t *testing.T) {
	e := newEnv(t, noIPLimits, func(c *Config) { c.PhoneHourly, c.PhoneDaily = 100, 100 })
	for i, s := range ukSpellings {
		e.at(time.Duration(i) * 61 * time.Second)
		e.want(e.send(s), http.StatusAccepted, fmt.Sprintf("send to %q", s))
		other := ukSpellings[(i+len(ukSpellings)/2+1)%len(ukSpellings)]
		e.want(e.verify(other, e.sms.code(t, uk)), http.StatusOK, fmt.Sprintf("verify as %q a code sent to %q", other, s))
	}
}

// badCase is one request the service must refuse, or accept.
type badCase struct {
	name, method, path, contentType, body string
	want                                  int
}

// badCases returns the requests of TestBadInput. Requests it expects to be
// accepted go to phoneN(i), each its own number.
func badCases() []badCase {
	const send, verify, js = "/api/sms/send", "/api/sms/verify", "application/json"
	obj := func(kv ...string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	var cs []badCase
	add := func(name, method, path, ct, body string, want int) {
		cs = append(cs, badCase{name, method, path, ct, body, want})
	}
	for _, p := range payloads {
		add(fmt.Sprintf("send to phone %q", p), "POST", send, js, obj("phone", p), http.StatusBadRequest)
		add(fmt.Sprintf("verify phone %q", p), "POST", verify, js, obj("phone", p, "code", "123456"), http.StatusBadRequest)
		add(fmt.Sprintf("verify code %q", p), "POST", verify, js, obj("phone", uk, "code", p), http.StatusBadRequest)
		add(fmt.Sprintf("send body %q", p), "POST", send, js, p, http.StatusBadRequest)
	}

	accepted := 0
	valid := func() string { accepted++; return obj("phone", phoneN(accepted)) }
	for _, n := range []int{1 << 10, 1 << 20, 10 << 20} {
		big := http.StatusRequestEntityTooLarge
		if n < maxBody {
			big = http.StatusBadRequest // too long for a number or a code, not for a body
		}
		add(fmt.Sprintf("%d bytes of junk", n), "POST", send, js, strings.Repeat("a", n), big)
		add(fmt.Sprintf("a phone of %d digits", n), "POST", send, js, obj("phone", strings.Repeat("1", n)), big)
		add(fmt.Sprintf("a phone of %d braces", n), "POST", verify, js, obj("phone", strings.Repeat("{", n), "code", "123456"), big)
		add(fmt.Sprintf("a code of %d digits", n), "POST", verify, js, obj("phone", uk, "code", strings.Repeat("1", n)), big)
		want := http.StatusAccepted // white space is no reason to refuse a body within the limit
		if n > maxBody {
			want = http.StatusRequestEntityTooLarge
		}
		add(fmt.Sprintf("a number and %d spaces", n), "POST", send, js, valid()+strings.Repeat(" ", n), want)
	}

	for _, body := range []string{
		`{`, `}`, `{"phone":}`, `{"phone":"+447400123456"`, `{"phone":"+447400123456"}}`, `{"phone":"+447400123456"} x`,
		`[]`, `"+447400123456"`, `447400123456`, `null`, `true`, `{"phone":null}`, `{"phone":447400123456}`,
		`{"phone":["+447400123456"]}`, `{"phone":{"$gt":""}}`, `{"phone":"+447400123456","extra":1}`,
		`{"phone":"\ud800"}`, "\xef\xbb\xbf{\"phone\":\"+447400123456\"}", "{\"phone\":\"+447400123456\x00\"}",
		`{'phone':'+447400123456'}`, `phone=+447400123456`, strings.Repeat("[", 2000) + strings.Repeat("]", 2000),
		strings.Repeat(`{"phone":`, 400) + `"+447400123456"` + strings.Repeat(`}`, 400),
	} {
		add(fmt.Sprintf("send body %.40q", body), "POST", send, js, body, http.StatusBadRequest)
		add(fmt.Sprintf("verify body %.40q", body), "POST", verify, js, body, http.StatusBadRequest)
	}

	for _, ct := range []string{"", "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
		"multipart/form-data; boundary=x", "application/jsonx", "application/json-patch+json", "json", "*/*",
		"application/json; charset"} {
		add(fmt.Sprintf("send as %q", ct), "POST", send, ct, valid(), http.StatusUnsupportedMediaType)
		add(fmt.Sprintf("verify as %q", ct), "POST", verify, ct, obj("phone", uk, "code", "123456"), http.StatusUnsupportedMediaType)
	}
	for _, ct := range []string{"application/json; charset=utf-8", "Application/JSON"} {
		add(fmt.Sprintf("send as %q", ct), "POST", send, ct, valid(), http.StatusAccepted)
	}

	for _, path := range []string{send, verify} {
		for _, m := range []string{"GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"} {
			add(m+" "+path, m, path, js, valid(), http.StatusMethodNotAllowed)
		}
	}
	return cs
}

// Bad input gets a clear 4xx: 400 for what is not a number, a code or one
// JSON object of them; 413 past 4 KiB; 415 unless declared as JSON; 405 for
// another method than POST. Never a 5xx or a panic (the server would drop
// the connection), never a message, and every key in Redis is one of the
// service's, holding no byte of a request.
func TestBadInput(t *testing.T) {
	onBackends(t, []func(*Config){noIPLimits}, func(t *testing.T, e *env) {
		accepted := map[string]bool{}
		for _, c := range badCases() {
			r := e.do(c.method, c.path, c.body, "Content-Type", c.contentType)
			switch {
			case r.status >= 500:
				t.Fatalf("%s: %v; want %d", c.name, r, c.want)
			case r.status != c.want:
				t.Errorf("%s: %v; want %d", c.name, r, c.want)
			case c.want == http.StatusMethodNotAllowed:
				if allow := r.header.Get("Allow"); allow != "POST" {
					t.Errorf("%s: Allow %q; want POST", c.name, allow)
				}
			case c.want == http.StatusAccepted:
				var req struct{ Phone string }
				_ = json.Unmarshal([]byte(c.body), &req)
				accepted[req.Phone] = true
			case r.body.Error == "" || r.header.Get("Content-Type") != "application/json":
				t.Errorf("%s: %v, Content-Type %q; want a JSON error", c.name, r, r.header.Get("Content-Type"))
			}
		}
		for _, m := range e.sms.messages() {
			if !accepted[m.to] {
				t.Errorf("a message to %s, which no accepted request asked for", m.to)
			}
		}
		stray, n := e.strayKeys()
		if len(stray) > 0 {
			t.Fatalf("keys outside the service's: %q", stray)
		}
		if n == 0 {
			t.Fatal("no keys at all: the accepted requests should have left some")
		}
	})
}
