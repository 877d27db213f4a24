package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

const adminToken = "operators-token-of-32-bytes-1234"

// adminEnv is an env with the operators' tools served beside it.
type adminEnv struct {
	*env
	admin *httptest.Server
}

func newAdminEnv(t *testing.T, opts ...func(*Config)) *adminEnv {
	t.Helper()
	e := newEnv(t, opts...)
	a := &adminEnv{env: e, admin: httptest.NewServer(e.svc.AdminHandler(adminToken))}
	t.Cleanup(a.admin.Close)
	return a
}

// adminAnswer is an answer of the tools.
type adminAnswer struct {
	status int
	header http.Header
	raw    string
}

func (r adminAnswer) String() string { return fmt.Sprint(r.status, " ", strings.TrimSpace(r.raw)) }

// call sends a request to the tools with the Authorization header auth
// ("" for none) and a JSON body (if any).
func (a *adminEnv) call(method, path, auth, body string) adminAnswer {
	a.t.Helper()
	req, err := http.NewRequest(method, a.admin.URL+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	res, err := a.admin.Client().Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return adminAnswer{status: res.StatusCode, header: res.Header, raw: string(b)}
}

// api calls the tools with the token and decodes a 200's JSON into v.
func (a *adminEnv) api(method, path, body string, v any) adminAnswer {
	a.t.Helper()
	r := a.call(method, path, "Bearer "+adminToken, body)
	if r.status != http.StatusOK {
		a.t.Fatalf("%s %s = %v; want 200\nlogs:\n%s", method, path, r, a.logs)
	}
	if v != nil {
		dec := json.NewDecoder(strings.NewReader(r.raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			a.t.Fatalf("%s %s: %q: %v", method, path, r.raw, err)
		}
	}
	return r
}

func (a *adminEnv) state(phone string) (numberState, string) {
	a.t.Helper()
	var st numberState
	r := a.api("GET", "/api/number?phone="+url.QueryEscape(phone), "", &st)
	return st, r.raw
}

func (a *adminEnv) reset(phone string) {
	a.t.Helper()
	var rep demoResetReply
	a.api("POST", "/api/number/reset", fmt.Sprintf(`{"phone":%q}`, phone), &rep)
	if rep.Number != phone || strings.Join(rep.Reset, ",") != "number,verify-failures" {
		a.t.Fatalf("reset = %+v; want number,verify-failures of %s", rep, phone)
	}
}

// guard returns the state's guard of scope.
func guardOf(t *testing.T, st numberState, scope string) guardState {
	t.Helper()
	for _, g := range st.Guards {
		if g.Scope == scope {
			return g
		}
	}
	t.Fatalf("no guard %s in %+v", scope, st)
	return guardState{}
}

// Every API request without the token gets 401 and nothing else, and
// changes nothing; the page itself is served to anyone (it holds no data).
func TestAdminTokenRequired(t *testing.T) {
	a := newAdminEnv(t)
	a.want(a.send(number), http.StatusAccepted, "send")
	requests := []struct{ method, path, body string }{
		{"GET", "/api/number?phone=" + url.QueryEscape(number), ""},
		{"POST", "/api/number/reset", `{"phone":"` + number + `"}`},
		{"GET", "/api/prefixes", ""},
		{"POST", "/api/prefixes/resume", `{"prefix":"+8613800"}`},
		{"GET", "/api/budget", ""},
		{"GET", "/api/nothing-here", ""},
	}
	for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer wrong", "Bearer " + adminToken + "x",
		"Bearer " + adminToken[:len(adminToken)-1], adminToken, "Basic " + adminToken, "Bearer  " + adminToken} {
		for _, q := range requests {
			r := a.call(q.method, q.path, auth, q.body)
			if r.status != http.StatusUnauthorized || strings.TrimSpace(r.raw) != `{"error":"unauthorized"}` ||
				r.header.Get("WWW-Authenticate") == "" {
				t.Fatalf("%s %s with Authorization %q = %v; want 401 with no detail", q.method, q.path, auth, r)
			}
		}
	}
	// The reset without the token did nothing: the cooldown holds.
	a.want(a.send(number), http.StatusTooManyRequests, "send after resets without the token")
	for _, auth := range []string{"Bearer " + adminToken, "bearer " + adminToken} {
		if r := a.call("GET", "/api/budget", auth, ""); r.status != http.StatusOK {
			t.Fatalf("budget with %q = %v; want 200", auth, r)
		}
	}
	page := a.call("GET", "/", "", "")
	if page.status != http.StatusOK || !strings.Contains(page.raw, `<script src="/admin.js" defer>`) ||
		!strings.Contains(page.header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("page = %v %v", page.status, page.header)
	}
	if strings.Contains(a.logs.String(), number) {
		t.Fatalf("a clear number in the logs:\n%s", a.logs)
	}
	// The public address serves none of the tools, nor their page.
	for _, path := range []string{"/api/budget", "/admin/", "/admin/admin.js", "/admin.js", "/admin.css"} {
		a.want(a.do("GET", path, nil), http.StatusNotFound, "GET "+path+" on the public address")
	}
}

// A number in its cooldown, and one locked out of verification, can be
// sent codes again once reset; the state tells both, and never the code.
func TestAdminNumberStateAndReset(t *testing.T) {
	a := newAdminEnv(t, noIPLimits, func(c *Config) { c.MaxDailyFailures = 2; c.MaxAttempts = 5 })
	st, raw := a.state(number)
	if g := guardOf(t, st, "number"); !g.Allowed || g.Remaining != 1 || g.RetryAfter != 0 || st.CodeOutstanding || st.LockedOut {
		t.Fatalf("a fresh number: %s", raw)
	}
	a.want(a.send(number), http.StatusAccepted, "send")
	code := a.sms.code(t, number)
	r := a.send(number)
	a.want(r, http.StatusTooManyRequests, "send in the cooldown")
	st, raw = a.state(number)
	g := guardOf(t, st, "number")
	if g.Allowed || g.Tightest != "cooldown" || g.RetryAfter != 60 || len(g.Rules) != 3 ||
		g.Rules[0] != (ruleState{"cooldown", 0, 60}) || g.Rules[1] != (ruleState{"hourly", 4, 0}) || g.Rules[2] != (ruleState{"daily", 9, 0}) {
		t.Fatalf("in the cooldown: guard %+v; want denied by cooldown for 60 s, 4 left this hour, 9 today\n%s", g, raw)
	}
	if p := guardOf(t, st, "prefix"); !p.Allowed || p.Rules[0].Remaining != 100_000-1 {
		t.Fatalf("prefix %+v; want 1 used", p)
	}
	if !st.CodeOutstanding || st.CodeExpiresIn != 300 || st.LockedOut || st.Number != number || st.Prefix != "+8613800" {
		t.Fatalf("state %s; want a code outstanding for 300 s, not locked out", raw)
	}
	a.wantNoCode(raw, number, code)
	a.reset(number)
	a.want(a.send(number), http.StatusAccepted, "send after the reset")

	// Locked out: two wrong guesses (MaxDailyFailures 2).
	code = a.sms.code(t, number)
	wrong := fmt.Sprintf("%06d", (atoi(code)+1)%1_000_000)
	a.want(a.verify(number, wrong), http.StatusUnauthorized, "wrong 1")
	a.want(a.verify(number, wrong), http.StatusUnauthorized, "wrong 2")
	a.at(2 * time.Minute) // the cooldown over: only the lockout denies
	a.want(a.send(number), http.StatusTooManyRequests, "send when locked out")
	st, raw = a.state(number)
	if f := guardOf(t, st, "verify-failures"); !st.LockedOut || f.Allowed || f.Remaining != 0 || f.RetryAfter < 1 {
		t.Fatalf("locked out: %s", raw)
	}
	a.wantNoCode(raw, number, code)
	a.reset(number)
	st, raw = a.state(number)
	if st.LockedOut || !guardOf(t, st, "number").Allowed {
		t.Fatalf("after the reset: %s", raw)
	}
	a.want(a.send(number), http.StatusAccepted, "send after the lockout's reset")
	a.want(a.verify(number, a.sms.code(t, number)), http.StatusOK, "verify after the reset")
	st, raw = a.state(number)
	if st.CodeOutstanding {
		t.Fatalf("a used code outstanding: %s", raw)
	}
	a.wantCleanLogs(number, code)
	if !strings.Contains(a.logs.String(), `msg="admin: number reset" limits=number,verify-failures to=+86*******8000`) {
		t.Fatalf("the reset is not logged, masked:\n%s", a.logs)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// wantNoCode fails unless raw holds neither the code nor its stored HMAC.
func (a *adminEnv) wantNoCode(raw, phone, code string) {
	a.t.Helper()
	mac := hex.EncodeToString(a.svc.codes.mac("code", phone, code))
	if strings.Contains(raw, code) || strings.Contains(raw, mac) || strings.Contains(raw, a.svc.codes.key(phone)) {
		a.t.Fatalf("the number's state holds its code %s, or its HMAC or key: %s", code, raw)
	}
}

// wantCleanLogs fails if the logs hold the clear number (or its national
// digits) or the code.
func (a *adminEnv) wantCleanLogs(phone, code string) {
	a.t.Helper()
	logs := a.logs.String()
	if strings.Contains(logs, phone) || strings.Contains(logs, phone[3:]) || strings.Contains(logs, code) {
		a.t.Fatalf("the logs hold the number %s or the code %s:\n%s", phone, code, logs)
	}
}

// The admin API's bad input: a number that is not one, a body not JSON.
func TestAdminBadInput(t *testing.T) {
	a := newAdminEnv(t)
	for _, q := range []struct {
		method, path, body string
		status             int
	}{
		{"GET", "/api/number?phone=abc", "", http.StatusBadRequest},
		{"GET", "/api/number", "", http.StatusBadRequest},
		{"GET", "/api/number?phone=%2B861065529988", "", http.StatusUnprocessableEntity}, // a landline
		{"POST", "/api/number/reset", `{"phone":"12"}`, http.StatusBadRequest},
		{"POST", "/api/number/reset", `{"phone":"` + number + `","x":1}`, http.StatusBadRequest},
		{"GET", "/api/number/reset", "", http.StatusMethodNotAllowed},
	} {
		if r := a.call(q.method, q.path, "Bearer "+adminToken, q.body); r.status != q.status {
			t.Errorf("%s %s %s = %v; want %d", q.method, q.path, q.body, r, q.status)
		}
	}
	req, _ := http.NewRequest("POST", a.admin.URL+"/api/number/reset", bytes.NewReader([]byte(`{"phone":"`+number+`"}`)))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "text/plain")
	res, err := a.admin.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("a text/plain reset = %d; want 415", res.StatusCode)
	}
}
