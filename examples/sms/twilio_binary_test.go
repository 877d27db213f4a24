package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The binary on Twilio as it is run, against a fake of Twilio's API on
// loopback: it asks for delivery reports at -public-url, takes a signed
// report of an undelivered message (the budget's unit back, counted in
// /metrics) and refuses an unsigned one; a Twilio that hangs costs a send
// -provider-timeout, then 502.
func TestBinaryTwilio(t *testing.T) {
	t.Parallel()
	const public = "https://sms.example/otp"
	hang := make(chan struct{})
	var n atomic.Int64
	fake, _ := twilioServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) > 1 {
			select { // the second message: no answer
			case <-r.Context().Done():
			case <-hang:
			}
			return
		}
		if r.FormValue("StatusCallback") != public+reportPath {
			http.Error(w, "StatusCallback "+r.FormValue("StatusCallback"), http.StatusBadRequest)
			return
		}
		twilioAnswer(201, `{"sid": "SM0123456789abcdef0123456789abcdef"}`)(w, r)
	})
	t.Cleanup(func() { close(hang) }) // before fake.Close, which waits for the handler
	p := startBinary(t, []string{"TWILIO_API_URL=" + fake.URL, "TWILIO_ACCOUNT_SID=" + twilioTestSID,
		"TWILIO_AUTH_TOKEN=" + twilioTestToken, "TWILIO_FROM=" + twilioTestFrom, "TWILIO_API_KEY_SID=", "TWILIO_MESSAGING_SERVICE_SID="},
		"-provider", "twilio", "-provider-timeout", "500ms", "-public-url", public)
	client := &http.Client{Timeout: 20 * time.Second}
	defer client.CloseIdleConnections()
	post := func(path, ct, body string, header ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", p.base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", ct)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if status, body := post("/api/sms/send", "application/json", `{"phone":"+8613800138000"}`); status != http.StatusAccepted {
		t.Fatalf("send = %d %s; want 202\nstderr:\n%s", status, body, p.stderr)
	}
	form := url.Values{"MessageSid": {"SM0123456789abcdef0123456789abcdef"}, "MessageStatus": {"undelivered"}, "AccountSid": {twilioTestSID}}
	if status, _ := post(reportPath, "application/x-www-form-urlencoded", form.Encode()); status != http.StatusForbidden {
		t.Errorf("unsigned report = %d; want 403", status)
	}
	sig := twilioSignature(twilioTestToken, public+reportPath, form)
	if status, _ := post(reportPath, "application/x-www-form-urlencoded", form.Encode(), "X-Twilio-Signature", sig); status != http.StatusNoContent {
		t.Errorf("signed report = %d; want 204\nstderr:\n%s", status, p.stderr)
	}
	res, err := client.Get(p.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{`sms_delivery_reports_total{result="undelivered"} 1`, `sms_delivery_reports_total{result="forbidden"} 1`} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	start := time.Now()
	if status, body := post("/api/sms/send", "application/json", `{"phone":"+8613800138001"}`); status != http.StatusBadGateway {
		t.Fatalf("send to a hung Twilio = %d %s; want 502", status, body)
	}
	took := time.Since(start)
	t.Logf("send to a hung Twilio: 502 after %v (-provider-timeout 500ms)", took)
	if took > 4*time.Second {
		t.Errorf("502 after %v; want about -provider-timeout, 500 ms (the default is 5 s)", took)
	}
	p.stop(t)
}

// Misconfigured, the service does not start, and says what to set.
func TestRunConfigErrors(t *testing.T) {
	for _, k := range []string{"TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN", "TWILIO_API_KEY_SID", "TWILIO_FROM", "TWILIO_MESSAGING_SERVICE_SID", "TWILIO_API_URL", "SMS_PUBLIC_URL"} {
		t.Setenv(k, "")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-provider", "twilio"}, "set TWILIO_ACCOUNT_SID (or -twilio-account-sid): it must be AC followed by 32 hex digits"},
		{[]string{"-provider", "twilio", "-twilio-account-sid", twilioTestSID}, "set TWILIO_AUTH_TOKEN"},
		{[]string{"-provider", "twilio", "-twilio-url", "http://api.twilio.com"}, `TWILIO_API_URL (or -twilio-url): "http://api.twilio.com": http only to a loopback host`},
		{[]string{"-write-timeout", "5s"}, "-write-timeout 5s must exceed -provider-timeout 5s"},
		{[]string{"-read-timeout", "0"}, "must be positive"},
		{[]string{"-provider-timeout", "0", "-write-timeout", "1s"}, "the provider timeout must be positive"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := run(ctx, append([]string{"-addr", "127.0.0.1:0"}, tc.args...), io.Discard, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run = %v; want an error holding %q", err, tc.want)
			}
			if regexp.MustCompile(`%[0-9A-F]{2}`).MatchString(err.Error()) {
				t.Errorf("run = %v: URL-escaped", err)
			}
		})
	}
}
