package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Twilio's documented example of its request validation: auth token
// 12345, a POST to https://mycompany.com/myapp.php?foo=1&bar=2 with these
// parameters is signed RSOYDt4T1cUTdK1PDd93/VVr8B8= (Twilio's security docs,
// and the tests of its own libraries).
func TestTwilioSignatureDocumented(t *testing.T) {
	form := url.Values{"CallSid": {"CA1234567890ABCDE"}, "Caller": {"+14158675309"}, "Digits": {"1234"},
		"From": {"+14158675309"}, "To": {"+18005551212"}}
	const documented = "RSOYDt4T1cUTdK1PDd93/VVr8B8="
	if got := twilioSignature("12345", "https://mycompany.com/myapp.php?foo=1&bar=2", form); got != documented {
		t.Fatalf("signature %s; Twilio documents %s", got, documented)
	}
	// Report checks the StatusCallback URL with the request's query: the
	// signature holds, and the report is refused for what it lacks, a
	// message sid.
	tw := newTestTwilio(t, TwilioConfig{AuthToken: "12345", StatusCallback: "https://mycompany.com/myapp.php"})
	r := reportRequest("/api/sms/delivery-report?foo=1&bar=2", form, documented)
	if _, err := tw.Report(r); !errors.Is(err, errBadReport) || !strings.Contains(err.Error(), "no message sid") {
		t.Fatalf("Report = %v; want a valid signature and no message sid", err)
	}
	form.Set("Digits", "1235")
	r = reportRequest("/api/sms/delivery-report?foo=1&bar=2", form, documented)
	if _, err := tw.Report(r); !errors.Is(err, errBadReport) || !strings.Contains(err.Error(), "X-Twilio-Signature") {
		t.Fatalf("Report of a changed parameter = %v; want a bad signature", err)
	}
}

// reportRequest is a POST of form to target signed sig ("" : unsigned).
func reportRequest(target string, form url.Values, sig string) *http.Request {
	r := httptest.NewRequest("POST", target, strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if sig != "" {
		r.Header.Set("X-Twilio-Signature", sig)
	}
	return r
}

// reportEnv is an env whose provider is Twilio, faked, asked for delivery
// reports at callback; each message gets a sid of its own.
type reportEnv struct {
	*env
	callback string
	sids     chan string
}

func newReportEnv(t *testing.T) *reportEnv { return reportEnvOn(t, newEnv(t)) }

// reportEnvOn makes e a reportEnv.
func reportEnvOn(t *testing.T, e *env) *reportEnv {
	var n atomic.Int64
	re := &reportEnv{callback: "https://sms.example" + reportPath, sids: make(chan string, 100)}
	fake, _ := twilioServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.FormValue("StatusCallback") != re.callback {
			http.Error(w, "no StatusCallback", http.StatusBadRequest)
			return
		}
		sid := fmt.Sprintf("SM%032x", n.Add(1))
		re.sids <- sid
		twilioAnswer(201, `{"sid": "`+sid+`", "status": "queued"}`)(w, r)
	})
	re.env = e
	re.svc.provider = newTestTwilio(t, TwilioConfig{BaseURL: fake.URL, StatusCallback: re.callback})
	return re
}

// sent sends a code to phone and returns its message's sid.
func (re *reportEnv) sent(phone string) string {
	re.t.Helper()
	re.want(re.send(phone), http.StatusAccepted, "send")
	return <-re.sids
}

// report posts a delivery report of sid with status, signed by sign (nil:
// Twilio's signature with the test token), and returns the answer's status.
func (re *reportEnv) report(sid, status string, sign func(form url.Values) string) int {
	re.t.Helper()
	form := url.Values{"MessageSid": {sid}, "SmsSid": {sid}, "MessageStatus": {status}, "SmsStatus": {status},
		"AccountSid": {twilioTestSID}, "From": {twilioTestFrom}, "To": {number}, "ApiVersion": {"2010-04-01"}}
	if status == "undelivered" || status == "failed" {
		form.Set("ErrorCode", "30003")
	}
	sig := twilioSignature(twilioTestToken, re.callback, form)
	if sign != nil {
		sig = sign(form)
	}
	req, err := http.NewRequest("POST", re.srv.URL+reportPath, strings.NewReader(form.Encode()))
	if err != nil {
		re.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if sig != "" {
		req.Header.Set("X-Twilio-Signature", sig)
	}
	res, err := re.srv.Client().Do(req)
	if err != nil {
		re.t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// budgetLeft is what the budget guard has left.
func (re *reportEnv) budgetLeft() int64 {
	re.t.Helper()
	d, err := re.svc.budget.Peek(context.Background(), budgetKey)
	if err != nil {
		re.t.Fatal(err)
	}
	return d.Remaining
}

// A genuine report of a message the service sent, failed or undelivered,
// gives the budget's unit back, once; a report with a bad or no signature
// is refused with 403 and changes nothing; a delivered message, or one the
// service did not send, changes nothing.
//
// On miniredis and on a redis-server, with a budget that leaks one unit in
// some 6 minutes: the test sees it as it left it.
func TestDeliveryReports(t *testing.T) {
	onBackends(t, []func(*Config){func(c *Config) { c.DailyBudget = 240 }}, func(t *testing.T, e *env) {
		testDeliveryReports(t, reportEnvOn(t, e))
	})
}

func testDeliveryReports(t *testing.T, re *reportEnv) {
	full := re.budgetLeft()
	sid := re.sent(number)
	ttl, err := re.svc.client.TTL(context.Background(), sentKey(sid)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 0 || ttl > sentTTL {
		t.Fatalf("the sent message's key has TTL %v; want up to %v", ttl, sentTTL)
	}
	// A second message, so that a refund too many would show: the budget
	// is never refunded above full.
	re.sent("+8613800138001")
	full--
	if got := re.budgetLeft(); got != full-1 {
		t.Fatalf("budget left %d after two sends; want %d", got, full-1)
	}
	for _, tc := range []struct {
		name string
		sign func(url.Values) string
	}{
		{"no signature", func(url.Values) string { return "" }},
		{"another token", func(f url.Values) string { return twilioSignature("another token", re.callback, f) }},
		{"another URL", func(f url.Values) string { return twilioSignature(twilioTestToken, re.srv.URL+reportPath, f) }},
		{"another status", func(f url.Values) string {
			g := url.Values{}
			for k, v := range f {
				g[k] = v
			}
			g.Set("MessageStatus", "delivered")
			return twilioSignature(twilioTestToken, re.callback, g)
		}},
		{"garbage", func(url.Values) string { return "RSOYDt4T1cUTdK1PDd93/VVr8B8=" }},
	} {
		if got := re.report(sid, "undelivered", tc.sign); got != http.StatusForbidden {
			t.Errorf("report with %s = %d; want 403", tc.name, got)
		}
	}
	if got := re.metric("sms_delivery_reports_total", `result="forbidden"`); got != 5 {
		t.Errorf("forbidden reports counted %v; want 5", got)
	}
	for _, status := range []string{"queued", "sent", "delivered"} {
		if got := re.report(sid, status, nil); got != http.StatusNoContent {
			t.Errorf("report %s = %d; want 204", status, got)
		}
	}
	if got := re.report(fmt.Sprintf("SM%032x", 999), "failed", nil); got != http.StatusNoContent {
		t.Errorf("report of a message not sent = %d; want 204", got)
	}
	if got := re.budgetLeft(); got != full-1 {
		t.Fatalf("budget left %d after reports that refund nothing; want %d", got, full-1)
	}
	if got := re.report(sid, "undelivered", nil); got != http.StatusNoContent {
		t.Fatalf("report undelivered = %d; want 204", got)
	}
	if got := re.budgetLeft(); got != full {
		t.Fatalf("budget left %d after an undelivered report; want %d, the unit back", got, full)
	}
	for _, status := range []string{"undelivered", "failed"} {
		if got := re.report(sid, status, nil); got != http.StatusNoContent {
			t.Errorf("report %s again = %d; want 204", status, got)
		}
	}
	if got := re.budgetLeft(); got != full {
		t.Fatalf("budget left %d after the report came again; want %d, one refund", got, full)
	}
	if got := re.metric("sms_delivery_reports_total", `result="undelivered"`); got != 1 {
		t.Errorf("undelivered reports counted %v; want 1", got)
	}
	if got := re.metric("sms_delivery_reports_total", `result="unknown"`); got != 3 {
		t.Errorf("unknown reports counted %v; want 3 (one not sent, two repeated)", got)
	}
	if stray, _ := re.strayKeys(); len(stray) > 0 {
		t.Errorf("keys of no known shape: %v", stray)
	}
}

// Copies of one report at once refund once; each message's report refunds
// its own unit.
func TestDeliveryReportsAtOnce(t *testing.T) {
	re := newReportEnv(t)
	full := re.budgetLeft()
	sids := []string{re.sent(number), re.sent("+8613800138001"), re.sent("+8613800138002")}
	var wg sync.WaitGroup
	statuses := make(chan int, 3*20)
	for _, sid := range sids[:2] {
		for range 20 {
			wg.Go(func() { statuses <- re.reportQuiet(sid, "failed") })
		}
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusNoContent {
			t.Fatalf("a report = %d; want 204", s)
		}
	}
	if got := re.budgetLeft(); got != full-1 {
		t.Fatalf("budget left %d after 20 copies of 2 messages' reports; want %d (3 sent, 2 refunded)", got, full-1)
	}
}

// reportQuiet is report for goroutines other than the test's: a valid
// report, its status or 0 on a transport error.
func (re *reportEnv) reportQuiet(sid, status string) int {
	form := url.Values{"MessageSid": {sid}, "MessageStatus": {status}, "AccountSid": {twilioTestSID}}
	req, _ := http.NewRequest("POST", re.srv.URL+reportPath, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Twilio-Signature", twilioSignature(twilioTestToken, re.callback, form))
	res, err := re.srv.Client().Do(req)
	if err != nil {
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// Without reports asked for (the console provider, or Twilio without
// -public-url), the address answers 404 and a send asks Twilio for none.
func TestDeliveryReportsOff(t *testing.T) {
	e := newEnv(t)
	if r := e.do("POST", reportPath, "MessageSid=SM1"); r.status != http.StatusNotFound {
		t.Errorf("report with the console provider = %v; want 404", r)
	}
	fake, n := twilioServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.ParseForm() != nil || r.PostForm.Has("StatusCallback") {
			http.Error(w, "a StatusCallback", http.StatusBadRequest)
			return
		}
		twilioAnswer(201, `{"sid": "SMaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}`)(w, r)
	})
	e.svc.provider = newTestTwilio(t, TwilioConfig{BaseURL: fake.URL})
	e.want(e.send(number), http.StatusAccepted, "send without reports")
	if n.Load() != 1 {
		t.Fatalf("Twilio saw %d requests; want 1", n.Load())
	}
	if keys := e.b.Mini.Keys(); strings.Contains(strings.Join(keys, " "), "sms:sent:") {
		t.Errorf("keys %v: a message remembered without reports", keys)
	}
	if r := e.do("POST", reportPath, "MessageSid=SM1"); r.status != http.StatusNotFound {
		t.Errorf("report without -public-url = %v; want 404", r)
	}
}

// A provider that does not answer costs a send ProviderTimeout, then 502:
// Twilio's own 10 s client time-out does not apply first.
func TestProviderTimeout(t *testing.T) {
	hang := make(chan struct{})
	fake, _ := twilioServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-hang:
		}
	})
	t.Cleanup(func() { close(hang) }) // before fake.Close, which waits for the handler
	e := newEnv(t, func(c *Config) { c.ProviderTimeout = 300 * time.Millisecond })
	e.svc.provider = newTestTwilio(t, TwilioConfig{BaseURL: fake.URL})
	start := time.Now()
	e.want(e.send(number), http.StatusBadGateway, "send to a hung provider")
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the send took %v; want about the provider time-out, 300 ms", took)
	}
}

// An undelivered report tells the conversion guard: the send it reports
// counts as undelivered (u) in its prefix's outcomes at once.
func TestReportTellsTheConversionGuard(t *testing.T) {
	re := reportEnvOn(t, newEnv(t, func(c *Config) { c.Conversion = defaultConversion() }))
	sid := re.sent(number)
	dest, err := re.svc.numbers.parse(number, "", re.svc.cfg.PrefixDigits)
	if err != nil {
		t.Fatal(err)
	}
	outcomes := re.svc.conversion.keys(dest.Prefix)[1]
	if got := re.report(sid, "undelivered", nil); got != http.StatusNoContent {
		t.Fatalf("report: %d, want 204", got)
	}
	if vals := re.svc.client.HVals(context.Background(), outcomes).Val(); !slices.Equal(vals, []string{"u"}) {
		t.Fatalf("the prefix's outcomes after an undelivered report: %q, want [u]", vals)
	}
}
