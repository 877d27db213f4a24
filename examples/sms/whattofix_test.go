package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/guard/phonekey"
)

// phonekeyFix is what phonekey says of raw read in region, for the client:
// the service answers a number that is not one in the library's words.
func phonekeyFix(t *testing.T, raw, region string) string {
	t.Helper()
	_, err := phonekey.Parse(raw, region)
	if err == nil {
		t.Fatalf("phonekey reads %q in %s", raw, region)
	}
	return clientFix(err)
}

// clientFix is the Fix of the guard.RequestError in err's chain: what the
// client is told to fix.
func clientFix(err error) string {
	var re *guard.RequestError
	if errors.As(err, &re) {
		return re.Fix
	}
	return ""
}

// A 400 says what to fix (issue 46): the field missing, empty or of the
// wrong type, the country that is not a region, why a number is not one
// (in phonekey's words), the code that is not 6 digits, the unknown or
// repeated field, the byte where the JSON breaks. Each answer is exact.
func TestBadRequestSaysWhatToFix(t *testing.T) {
	e := newEnv(t, noIPLimits)
	const send, verify = "/api/sms/send", "/api/sms/verify"
	country := `field "country" is not a region code this service knows: give two letters of ISO 3166-1, such as "FR"`
	for _, c := range []struct{ path, body, want string }{
		// 1: the missing field, named.
		{send, `{}`, `missing field "phone"`},
		{send, `{"country":"GB"}`, `missing field "phone"`},
		{send, `{"phone":""}`, `empty field "phone"`},
		{send, `{"phone":null}`, `field "phone" must be a string, not null`},
		{send, `{"phone":13800138000}`, `field "phone" must be a string`},
		{send, `{"phone":{"$gt":""}}`, `field "phone" must be a string`},
		{send, `{"phone":"+447400123456","country":1}`, `field "country" must be a string`},
		// 2: the country, not the number.
		{send, `{"phone":"13800138009","country":"XX"}`, country},
		{send, `{"phone":"13800138009","country":"France"}`, country},
		{verify, `{"phone":"13800138009","country":"France","code":"123456"}`, country},
		// 3: why the number is not one, as phonekey says it.
		{send, `{"phone":"+44 7700 900123"}`, phonekeyFix(t, "+44 7700 900123", "CN")},
		{send, `{"phone":"+86 1"}`, phonekeyFix(t, "+86 1", "CN")},
		{send, `{"phone":"abc"}`, phonekeyFix(t, "abc", "CN")},
		{send, `{"phone":"07400 12345","country":"gb"}`, phonekeyFix(t, "07400 12345", "GB")},
		{verify, `{"phone":"12345","code":"123456"}`, phonekeyFix(t, "12345", "CN")},
		// 4: the code, the field, the JSON.
		{verify, `{"phone":"13800138000","code":"12345"}`, `field "code" must be 6 digits (0 to 9)`},
		{verify, `{"phone":"13800138000","code":"abcdef"}`, `field "code" must be 6 digits (0 to 9)`},
		{verify, `{"phone":"13800138000","code":"１２３４５６"}`, `field "code" must be 6 digits (0 to 9)`},
		{verify, `{"phone":"13800138000"}`, `missing field "code"`},
		{verify, `{"code":"123456"}`, `missing field "phone"`},
		{verify, `{"phone":"13800138000","code":"123456","x":1}`, `unknown field "x"`},
		{verify, `{"phone":`, `malformed JSON: the body ends at byte 9, before its JSON does`},
		{verify, `{"phone":}`, `malformed JSON at byte 10`},
		{send, `{"phone":"13800138000","channel":"voice"}`, `unknown field "channel"`},
		{send, `{"Phone":"13800138000"}`, `unknown field "Phone": did you mean "phone"? (names are case-sensitive)`},
		{send, `{"` + strings.Repeat("x", 40) + `":1}`, `an unknown field`},
		{send, `{"phone":"13800138000" "country":"CN"}`, `malformed JSON at byte 24`},
		{send, `{"phone":"13800138000"} x`, `the body must be one JSON object, with nothing after it (byte 25)`},
		{send, `{"phone":"13800138000"}{}`, `the body must be one JSON object, with nothing after it (byte 24)`},
		{send, `["13800138000"]`, `the body must be a JSON object`},
		{send, ` `, `missing request body`},
		// 5: a key given twice is refused, not read last-wins.
		{send, `{"phone":"+447400123456","phone":"+8613800138000"}`, `field "phone" given more than once`},
		{send, `{"phone":"+8613800138000","country":"CN","country":"GB"}`, `field "country" given more than once`},
		{verify, `{"phone":"13800138000","code":"123456","code":"654321"}`, `field "code" given more than once`},
		{verify, `{"phone":"13800138000","phone":"13800138001","code":"123456"}`, `field "phone" given more than once`},
	} {
		r := e.do("POST", c.path, c.body)
		if r.status != http.StatusBadRequest || r.body.Error != c.want {
			t.Errorf("POST %s %s = %v; want 400 %q", c.path, c.body, r, c.want)
		}
	}
	if ms := e.sms.messages(); len(ms) != 0 {
		t.Errorf("messages %v; want none", ms)
	}
	// 413 and 415 are as they were.
	if r := e.do("POST", send, strings.Repeat(" ", maxBody)+`{"phone":"13800138000"}`); r.status != http.StatusRequestEntityTooLarge || r.body.Error != "request too large" {
		t.Errorf("over 4 KiB: %v; want 413", r)
	}
	if r := e.do("POST", send, `{"phone":"13800138000"}`, "Content-Type", "text/plain"); r.status != http.StatusUnsupportedMediaType ||
		r.body.Error != "Content-Type must be application/json" {
		t.Errorf("text/plain: %v; want 415", r)
	}
}

// Every handler that reads a JSON body refuses a key given twice, the
// demo's reset and the operators' reset too: they all read it with decode.
func TestDuplicateKeysRefusedEverywhere(t *testing.T) {
	d := newDemoEnv(t)
	r := d.raw("POST", "/api/demo/reset", `{"phone":"13800138000","phone":"+447400123456"}`)
	if r.status != http.StatusBadRequest || r.err != `field "phone" given more than once` {
		t.Errorf("demo reset with phone twice: %v; want 400 naming the field", r)
	}
	a := newAdminEnv(t)
	for _, c := range []struct{ path, body, want string }{
		{"/api/number/reset", `{"phone":"13800138000","phone":"+447400123456"}`, `field "phone" given more than once`},
		{"/api/number/reset", `{}`, `missing field "phone"`},
		{"/api/prefixes/resume", `{"prefix":"+8613800","prefix":"+8613801"}`, `field "prefix" given more than once`},
	} {
		r := a.call("POST", c.path, "Bearer "+adminToken, c.body)
		var got struct{ Error string }
		_ = json.Unmarshal([]byte(r.raw), &got)
		if r.status != http.StatusBadRequest || got.Error != c.want {
			t.Errorf("POST %s %s = %v; want 400 %q", c.path, c.body, r, c.want)
		}
	}
	// decode itself, for a struct of any fields.
	var v struct {
		A string `json:"a"`
		B int    `json:"b,omitempty"`
		C string
		D string `json:"-"`
	}
	for body, want := range map[string]string{
		`{"a":"x","b":1,"C":"y"}`:     "",
		`{"a":"x","a":"x"}`:           `field "a" given more than once`,
		`{"C":"y","C":"y"}`:           `field "C" given more than once`,
		`{"D":"y"}`:                   `unknown field "D"`,
		`{"-":"y"}`:                   `unknown field "-"`,
		`{"b":"1"}`:                   `field "b" must be a number`,
		`{"a":"x","b":1,"a\u0000":1}`: `an unknown field`,
	} {
		req := httptest.NewRequest("POST", "/", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		err := decode(req, &v)
		if got := clientFix(err); got != want || (want == "") != (err == nil) {
			t.Errorf("decode %s: %v (%q); want %q", body, err, got, want)
		}
	}
}
