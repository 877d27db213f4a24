package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// watchPromises records, from now on, whether the page ever shows a
// promise of a text ("We will text", "Code sent"), in any element, however
// briefly: window.promisedForTest.
func (b *browser) watchPromises() {
	b.t.Helper()
	b.do("watch the page's words", chromedp.Evaluate[chromedp.Void](`(() => {
		window.promisedForTest = "";
		const look = () => {
			const m = /We will text[^\n]*|Code sent[^\n]*/.exec(document.body.innerText);
			if (m && !window.promisedForTest) window.promisedForTest = m[0];
		};
		new MutationObserver(look).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
		look();
	})()`))
}

// A landline, and a mobile of a country the service does not text: the
// page never says a text is coming, before the answer or after it, and
// says why the number gets none, in words.
func TestBrowserRefusedNumberNoPromise(t *testing.T) {
	e := newEnv(t) // countries CN and GB
	srv, tp := tapped(t, e.svc.Handler())
	b := newBrowser(t, e.logs)
	b.open(srv.URL + "/")
	b.watchPromises()

	for _, tc := range []struct {
		typed, reason, status, next string
	}{
		// A Beijing landline: the number the issue saw promised a text.
		{"+86 10 6552 9988", "landline", "+861065529988 is a landline, which cannot receive text messages.", "Give a mobile number."},
		{"+33 6 12 34 56 78", "country", "This service does not send codes to numbers of France.",
			"It sends them to numbers of China, United Kingdom."},
	} {
		b.typeNumber(tc.typed)
		b.wait("the preview", `!document.getElementById("e164-line").hidden`)
		if line := b.text("e164-line"); !strings.HasPrefix(line, "Read as ") {
			t.Errorf("preview of %s: %q; want \"Read as ...\", no promise", tc.typed, line)
		}
		b.do("send", chromedp.Click(chromedp.ID("send")))
		b.wait("the answer", fmt.Sprintf(`document.getElementById("status").textContent === %q`, tc.status))
		x := tp.last(t, "/api/sms/send")
		if x.status != http.StatusUnprocessableEntity || x.reply.Reason != tc.reason {
			t.Fatalf("send to %s: %d %s; want 422 with reason %s", tc.typed, x.status, x.raw, tc.reason)
		}
		if got := b.text("next"); got != tc.next {
			t.Errorf("next step for %s: %q; want %q", tc.typed, got, tc.next)
		}
		b.shot("refused-"+tc.reason+"-1280", 1280)
	}
	b.shot("refused-country-360", 360)
	if promised := eval[string](b, `window.promisedForTest`); promised != "" {
		t.Errorf("the page said %q for numbers the service refused", promised)
	}
	if n := len(e.sms.messages()); n != 0 {
		t.Errorf("%d messages sent; want none", n)
	}

	// The watch sees a promise when there is one: the 202 of a mobile.
	b.typeNumber("+86 138 0013 8000")
	b.do("send", chromedp.Click(chromedp.ID("send")))
	b.waitText("status", "Code sent to "+number+".")
	if promised := eval[string](b, `window.promisedForTest`); promised != "Code sent to "+number+"." {
		t.Errorf("the watch saw %q after a 202; want the page's \"Code sent to %s.\"", promised, number)
	}
}

// The last wrong attempt: the page says the code is spent, offers a new
// one (the button, counted down with the cooldown), and the new code
// verifies.
func TestBrowserLastAttempt(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Cooldown = time.Second })
	b := newBrowser(t, e.logs)
	b.open(e.srv.URL + "/")
	b.sendUsual()
	code := e.sms.code(t, number)
	for i := range e.cfg.MaxAttempts {
		b.do("type a wrong code", chromedp.SetValue(chromedp.ID("code"), wrong(code, int(i))), chromedp.Click(chromedp.ID("verify")))
		if i < e.cfg.MaxAttempts-1 {
			b.waitText("status", "Wrong or expired code.")
			if b.visible("renew") {
				t.Errorf("wrong guess %d: the new-code button is shown with attempts left", i+1)
			}
			b.do("clear the status", chromedp.Evaluate[chromedp.Void](`document.getElementById("status").textContent = ""`))
		}
	}
	b.waitText("status", "Wrong code, and that was the last attempt for this code.")
	if got := b.text("next"); got != "Request a new code to try again." {
		t.Errorf("next step %q; want \"Request a new code to try again.\"", got)
	}
	if !b.visible("renew") {
		t.Fatalf("no new-code button after the last attempt")
	}
	if enabled := eval[bool](b, `!document.getElementById("verify").disabled`); enabled {
		t.Errorf("the verify button is enabled for a spent code")
	}
	b.shot("last-attempt-1280", 1280)
	b.shot("last-attempt-360", 360)

	e.at(2 * time.Second) // past the cooldown, on the server's clock
	b.wait("the new-code button", `!document.getElementById("renew").disabled`)
	if got := b.text("renew"); got != "Request a new code" {
		t.Errorf("new-code button %q; want \"Request a new code\"", got)
	}
	b.do("request a new code", chromedp.Click(chromedp.ID("renew")))
	b.waitText("status", "Code sent to "+number+".")
	if n := len(e.sms.messages()); n != 2 {
		t.Fatalf("%d messages; want 2 (the new code)", n)
	}
	b.do("verify the new code", chromedp.SendKeys(chromedp.ID("code"), e.sms.code(t, number)), chromedp.Click(chromedp.ID("verify")))
	b.waitDone(number)
}

// A verified number: the forms give way to the finished state, which
// offers to start over; starting over brings back empty forms.
func TestBrowserFinished(t *testing.T) {
	e := newEnv(t)
	b := newBrowser(t, e.logs)
	b.open(e.srv.URL + "/")
	b.sendUsual()
	b.do("verify", chromedp.SendKeys(chromedp.ID("code"), e.sms.code(t, number)), chromedp.Click(chromedp.ID("verify")))
	b.waitDone(number)
	if got := b.text("done-title"); got != "Verified" {
		t.Errorf("finished state's title %q; want \"Verified\"", got)
	}
	b.shot("verified-done-1280", 1280)
	b.shot("verified-done-360", 360)

	b.do("start over", chromedp.Click(chromedp.ID("again")))
	b.wait("the forms", `document.getElementById("send-form").offsetParent !== null`)
	if b.visible("done") {
		t.Errorf("the finished state is still shown after \"Verify another number\"")
	}
	state := eval[struct {
		Phone, Code, Status string
		Focus               string
	}](b, `({Phone: document.getElementById("phone").value, Code: document.getElementById("code").value,
		Status: document.getElementById("status").textContent, Focus: document.activeElement.id})`)
	if state.Phone != "" || state.Code != "" || state.Status != "" || state.Focus != "phone" {
		t.Errorf("after starting over: %+v; want empty fields and status, the focus on the number", state)
	}
}

// The demo: after ten sends from one address, the page's send is refused
// for an hour; the page points to the demo's reset, which lifts the limit,
// and the send after it is accepted.
func TestBrowserDemoReset(t *testing.T) {
	e := newDemoEnv(t)
	srv, tp := tapped(t, e.svc.Handler())
	b := newBrowser(t, e.logs)
	b.open(srv.URL + "/")
	b.wait("the demo's reset", `document.getElementById("demo").offsetParent !== null`)
	for i := range 10 { // from 127.0.0.1, as the browser
		e.want(e.send(phoneN(i)), http.StatusAccepted, "send")
	}
	b.typeNumber("138 0013 8000")
	b.do("send", chromedp.Click(chromedp.ID("send")))
	b.wait("the 429", `document.getElementById("status").textContent.startsWith("Too many requests from your address: try again in ")`)
	if x := tp.last(t, "/api/sms/send"); x.status != http.StatusTooManyRequests || x.reply.Scope != "ip" {
		t.Fatalf("the eleventh send: %d %s; want 429 of scope ip", x.status, x.raw)
	}
	if got, want := b.text("next"), "This is a local demo: \u201cReset demo limits\u201d below lifts the limits now."; got != want {
		t.Errorf("next step %q; want %q", got, want)
	}
	if !eval[bool](b, `document.getElementById("demo").classList.contains("attention")`) {
		t.Errorf("the demo's reset is not marked for attention")
	}
	b.shot("demo-long-wait-1280", 1280)
	b.shot("demo-long-wait-360", 360)

	b.do("reset", chromedp.Click(chromedp.ID("demo-reset")))
	b.waitText("status", "Limits reset for your address and "+number+". You can send a code again.")
	if x := tp.last(t, "/api/demo/reset"); x.status != http.StatusOK {
		t.Fatalf("reset: %d %s; want 200", x.status, x.raw)
	}
	if text, enabled := b.sendButton(); text != "Send code" || !enabled {
		t.Errorf("after the reset: send button %q (enabled %v); want \"Send code\", enabled", text, enabled)
	}
	b.do("send", chromedp.Click(chromedp.ID("send")))
	b.waitText("status", "Code sent to "+number+".")
	if x := tp.last(t, "/api/sms/send"); x.status != http.StatusAccepted {
		t.Fatalf("the send after the reset: %d %s; want 202", x.status, x.raw)
	}
	b.shot("demo-after-reset-1280", 1280)
}

// The binary as a local demo (go run ./examples/sms): the picker offers
// the demo's handful of countries, the default first, and the demo's reset
// is shown.
func TestBrowserDemoPicker(t *testing.T) {
	p := startBinary(t, nil)
	b := newBrowser(t, p.stderr)
	b.open(p.base + "/")
	opts := eval[[]string](b, `[...document.getElementById("country").options].map(o => o.text)`)
	want := []string{"China (+86)", "France (+33)", "Germany (+49)", "India (+91)", "United Kingdom (+44)", "United States (+1)"}
	if fmt.Sprint(opts) != fmt.Sprint(want) {
		t.Errorf("picker %q; want %q", opts, want)
	}
	if !b.visible("demo") || b.text("demo-reset") != "Reset demo limits" {
		t.Errorf("the demo's reset is not shown")
	}
	b.do("open the picker's list", chromedp.Evaluate[chromedp.Void](`document.getElementById("country").size = 6`))
	b.shot("demo-picker-1280", 1280)
	p.stop(t)
}
