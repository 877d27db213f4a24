package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
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

// A paused prefix is listed with its figures, shown in its numbers' state,
// and resumed, by id or by prefix: its sends go out again.
func TestAdminPausedPrefixes(t *testing.T) {
	a := newAdminEnv(t, conversionOn, judging5)
	var list struct {
		Conversion bool           `json:"conversion"`
		Paused     []pausedPrefix `json:"paused"`
	}
	a.api("GET", "/api/prefixes", "", &list)
	if !list.Conversion || len(list.Paused) != 0 {
		t.Fatalf("before any pause: %+v", list)
	}
	pause := func() {
		for i := range 5 {
			a.want(a.send(phoneN(i), from(i)...), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
			if ok, err := a.svc.undelivered(t.Context(), phoneN(i)); !ok || err != nil {
				t.Fatalf("undelivered %d = %v, %v", i, ok, err)
			}
		}
		a.wantConversion(a.send(phoneN(5), from(5)...), ruleConversion, 3600, "6th send, 5 undelivered")
	}
	pause()
	raw := a.api("GET", "/api/prefixes", "", &list).raw
	if len(list.Paused) != 1 {
		t.Fatalf("paused: %s; want +8613900", raw)
	}
	p := list.Paused[0]
	if p.Prefix != "+8613900" || p.Verified != 0 || p.Judged != 5 || p.Left != 3600 || !p.Until.Equal(t0.Add(time.Hour)) {
		t.Fatalf("paused %+v; want +8613900, 0 of 5 verified, 3600 s left, until %v", p, t0.Add(time.Hour))
	}
	if st, raw := a.state(phoneN(7)); !st.PrefixPaused || st.PrefixPauseLeft != 3600 {
		t.Fatalf("a number of the paused prefix: %s", raw)
	}
	if st, raw := a.state(number); st.PrefixPaused {
		t.Fatalf("a number of another prefix: %s", raw)
	}
	var res struct {
		Resumed bool `json:"resumed"`
	}
	a.api("POST", "/api/prefixes/resume", `{"id":"`+p.ID+`"}`, &res)
	if !res.Resumed {
		t.Fatal("resume by id: not resumed")
	}
	a.want(a.send(phoneN(5), from(5)...), http.StatusAccepted, "a send after the resume")
	a.api("GET", "/api/prefixes", "", &list)
	if len(list.Paused) != 0 {
		t.Fatalf("after the resume: %+v", list)
	}
	a.api("POST", "/api/prefixes/resume", `{"id":"`+p.ID+`"}`, &res)
	if res.Resumed {
		t.Fatal("resume of a prefix not paused: resumed")
	}

	// Paused again (a resume empties the window: 5 sends more), resumed by
	// prefix.
	for i := range 5 {
		a.want(a.send(phoneN(10+i), from(i)...), http.StatusAccepted, "send")
		_, _ = a.svc.undelivered(t.Context(), phoneN(10+i))
	}
	a.wantConversion(a.send(phoneN(20), from(1)...), ruleConversion, 3600, "paused again")
	a.api("POST", "/api/prefixes/resume", `{"prefix":"+8613900"}`, &res)
	if !res.Resumed {
		t.Fatal("resume by prefix: not resumed")
	}
	a.want(a.send(phoneN(20), from(1)...), http.StatusAccepted, "a send after the resume by prefix")
	for _, bad := range []string{`{}`, `{"prefix":"8613900"}`, `{"id":"x"}`, `{"prefix":"+86 139"}`} {
		if r := a.call("POST", "/api/prefixes/resume", "Bearer "+adminToken, bad); r.status != http.StatusBadRequest {
			t.Fatalf("resume %s = %v; want 400", bad, r)
		}
	}
	if n, err := a.svc.client.Exists(t.Context(), a.svc.conversion.indexKey()).Result(); err != nil || n != 0 {
		t.Fatalf("the index of pauses outlives them: %d, %v", n, err)
	}
}

// An ended pause leaves the list, and the index expires with it.
func TestAdminPauseEnds(t *testing.T) {
	a := newAdminEnv(t, conversionOn, judging5)
	c := &clock{e: a.env}
	for i := range 5 {
		a.want(a.send(phoneN(i), from(i)...), http.StatusAccepted, "send")
		_, _ = a.svc.undelivered(t.Context(), phoneN(i))
	}
	a.wantConversion(a.send(phoneN(5), from(5)...), ruleConversion, 3600, "paused")
	ttl := a.b.Mini.TTL(a.svc.conversion.indexKey())
	if ttl <= 0 || ttl > time.Hour {
		t.Fatalf("the index's TTL = %v; want the pause's, 1 h", ttl)
	}
	c.to(time.Hour)
	var list struct {
		Conversion bool           `json:"conversion"`
		Paused     []pausedPrefix `json:"paused"`
	}
	a.api("GET", "/api/prefixes", "", &list)
	if len(list.Paused) != 0 || a.b.Mini.Exists(a.svc.conversion.indexKey()) {
		t.Fatalf("an ended pause is listed: %+v", list)
	}
}

// The budget's figures after N sends: used N, left the rest; its day and
// its end in its zone.
func TestAdminBudget(t *testing.T) {
	shanghai, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	a := newAdminEnv(t, noIPLimits, func(c *Config) { c.DailyBudget, c.BudgetZone = 10, shanghai })
	var b budgetState
	a.api("GET", "/api/budget", "", &b)
	if b.Used != 0 || b.Left != 10 || b.Limit != 10 {
		t.Fatalf("before any send: %+v", b)
	}
	for i := range 3 {
		a.want(a.send(phoneN(i)), http.StatusAccepted, "send")
	}
	a.want(a.send(phoneN(0)), http.StatusTooManyRequests, "a send denied (cooldown) costs no budget")
	raw := a.api("GET", "/api/budget", "", &b).raw
	// t0 is 2026-01-01 12:00 UTC, 20:00 in Shanghai: the day ends in 4 h.
	end := time.Date(2026, 1, 2, 0, 0, 0, 0, shanghai)
	if b.Used != 3 || b.Left != 7 || b.Zone != "Asia/Shanghai" || b.Day != "2026-01-01" || !b.ResetsAt.Equal(end) || b.ResetsIn != 4*3600 {
		t.Fatalf("after 3 sends: %s; want 3 used, 7 left, Asia/Shanghai's 2026-01-01, resetting at %v in 4 h", raw, end)
	}
	for i := range 7 {
		a.want(a.send(phoneN(10+i)), http.StatusAccepted, "send")
	}
	a.want(a.send(phoneN(20)), http.StatusTooManyRequests, "the 11th send")
	a.api("GET", "/api/budget", "", &b)
	if b.Used != 10 || b.Left != 0 {
		t.Fatalf("after the budget: %+v; want 10 used, 0 left", b)
	}
	a.at(4 * time.Hour) // midnight in Shanghai
	raw = a.api("GET", "/api/budget", "", &b).raw
	if b.Used != 0 || b.Left != 10 || b.Day != "2026-01-02" || b.ResetsIn != 24*3600 {
		t.Fatalf("the next day: %s", raw)
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

// The binary refuses tools without a token, or with a short one, and on an
// address other machines reach unless told; with a token on loopback it
// serves them.
func TestAdminBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "sms")
	if out, err := exec.Command(goTool(t), "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"-admin-addr", "127.0.0.1:0"}, "needs a bearer token of at least 16 bytes: set $SMS_ADMIN_TOKEN"},
		{[]string{"SMS_ADMIN_TOKEN=short"}, []string{"-admin-addr", "127.0.0.1:0"}, "needs a bearer token"},
		{[]string{"SMS_ADMIN_TOKEN=" + adminToken}, []string{"-admin-addr", "0.0.0.0:0"}, `-admin-addr "0.0.0.0:0" is not a loopback address`},
		{[]string{"SMS_ADMIN_TOKEN=" + adminToken}, []string{"-admin-addr", ":0"}, `-admin-addr ":0" is not a loopback address`},
		{[]string{"SMS_ADMIN_TOKEN=" + adminToken}, []string{"-admin-addr", "192.0.2.1:9"}, "pass -admin-allow-remote"},
	} {
		cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0"}, c.args...)...)
		cmd.Env = append(cmd.Environ(), c.env...)
		done := make(chan struct{})
		timer := time.AfterFunc(60*time.Second, func() {
			select {
			case <-done:
			default:
				_ = cmd.Process.Kill() // by pid: the process this test started
			}
		})
		out, err := cmd.CombinedOutput()
		close(done)
		timer.Stop()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), c.want) ||
			strings.Contains(string(out), "serving on") {
			t.Errorf("%v %v: %v\n%s\nwant exit 1, refused before serving: %s", c.env, c.args, err, out, c.want)
		}
	}
	help := exec.Command(bin, "-h")
	help.Env = append(help.Environ(), "SMS_ADMIN_TOKEN="+adminToken)
	if out, err := help.CombinedOutput(); err != nil || strings.Contains(string(out), adminToken) || !strings.Contains(string(out), "-admin-token") {
		t.Errorf("-h: %v; want the flags without the token\n%s", err, out)
	}
	p := startBinary(t, []string{"SMS_ADMIN_TOKEN=" + adminToken}, "-admin-addr", "127.0.0.1:0")
	m := regexp.MustCompile(`sms: operators' tools on (http://127\.0\.0\.1:[0-9]+)/`).FindStringSubmatch(p.stdout.String())
	if m == nil {
		t.Fatalf("no admin address in %s", p.stdout)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for auth, want := range map[string]int{"": 401, "Bearer " + adminToken: 200} {
		req, _ := http.NewRequest("GET", m[1]+"/api/budget", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("budget with %q = %d; want %d", auth, res.StatusCode, want)
		}
	}
	r, err := client.Get(p.base + "/api/budget")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusNotFound {
		t.Errorf("the tools on the public address: %d; want 404", r.StatusCode)
	}
	p.stop(t)
}

// On a Redis Cluster: the pauses of two prefixes (keys of two hash slots)
// are listed, a number's state read and reset, a prefix resumed by id.
func TestAdminCluster(t *testing.T) {
	c := testutil.Cluster(t)
	// A secret of its own, each run: the cluster is shared, by other tests
	// that send to these numbers and by the runs of -count.
	secret := []byte("admin cluster test " + rand.Text())
	e := newEnvOn(t, c.Client(t), conversionOn, judging5, func(c *Config) { c.Secret = secret })
	a := &adminEnv{env: e, admin: httptest.NewServer(e.svc.AdminHandler(adminToken))}
	t.Cleanup(a.admin.Close)
	for _, prefix := range []string{"+86136", "+86137"} {
		for i := range 5 {
			p := fmt.Sprintf("%s%08d", prefix, i)
			a.want(a.send(p, from(i)...), http.StatusAccepted, "send")
			if _, err := a.svc.undelivered(t.Context(), p); err != nil {
				t.Fatal(err)
			}
		}
		a.wantConversion(a.send(prefix+"00000009", from(9)...), ruleConversion, 3600, "paused")
	}
	var list struct {
		Conversion bool           `json:"conversion"`
		Paused     []pausedPrefix `json:"paused"`
	}
	raw := a.api("GET", "/api/prefixes", "", &list).raw
	if len(list.Paused) != 2 || list.Paused[0].Prefix != "+8613600" || list.Paused[1].Prefix != "+8613700" {
		t.Fatalf("paused %s; want +8613600 and +8613700", raw)
	}
	if st, raw := a.state("+8613600000000"); !st.PrefixPaused || !st.CodeOutstanding || guardOf(t, st, "number").Allowed {
		t.Fatalf("state %s; want paused, a code outstanding, in the cooldown", raw)
	}
	a.reset("+8613600000000")
	var res struct {
		Resumed bool `json:"resumed"`
	}
	a.api("POST", "/api/prefixes/resume", `{"id":"`+list.Paused[0].ID+`"}`, &res)
	if !res.Resumed {
		t.Fatal("not resumed")
	}
	a.want(a.send("+8613600000000", from(1)...), http.StatusAccepted, "a send after the reset and the resume")
	var b budgetState
	a.api("GET", "/api/budget", "", &b)
	if b.Used != 11 {
		t.Fatalf("budget %+v; want 11 used", b)
	}
}

// The loopback rule, by the flags' values: -admin-allow-remote lifts it.
func TestAdminAddrCheck(t *testing.T) {
	for _, c := range []struct {
		cfg adminConfig
		ok  bool
	}{
		{adminConfig{}, true}, // off
		{adminConfig{addr: "127.0.0.1:9090", token: adminToken}, true},
		{adminConfig{addr: "[::1]:9090", token: adminToken}, true},
		{adminConfig{addr: "localhost:9090", token: adminToken}, true},
		{adminConfig{addr: "127.0.0.1:9090"}, false},
		{adminConfig{addr: "127.0.0.1:9090", token: adminToken[:15]}, false},
		{adminConfig{addr: "0.0.0.0:9090", token: adminToken}, false},
		{adminConfig{addr: "[::]:9090", token: adminToken}, false},
		{adminConfig{addr: "admin.example:9090", token: adminToken}, false},
		{adminConfig{addr: "9090", token: adminToken}, false},
		{adminConfig{addr: "0.0.0.0:9090", token: adminToken, allowRemote: true}, true},
		{adminConfig{addr: "0.0.0.0:9090", allowRemote: true}, false}, // never without a token
	} {
		if err := c.cfg.check(); (err == nil) != c.ok || err != nil && !errors.Is(err, errConfig) {
			t.Errorf("%+v: %v; want ok %v", c.cfg, err, c.ok)
		}
	}
}
