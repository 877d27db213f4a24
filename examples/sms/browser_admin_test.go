package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// The operators' page: it asks for the token, says when it is refused,
// shows the budget, a number's guards and the paused prefixes, and its
// reset and resume buttons work; no code is ever on it.
func TestBrowserAdmin(t *testing.T) {
	a := newAdminEnv(t, conversionOn, judging5, func(c *Config) { c.DailyBudget = 100 })
	a.want(a.send(number), http.StatusAccepted, "send")
	code := a.sms.code(t, number)
	for i := range 5 { // +8613900 paused: 5 codes undelivered
		a.want(a.send(phoneN(i), from(i)...), http.StatusAccepted, "send")
		if _, err := a.svc.undelivered(t.Context(), phoneN(i)); err != nil {
			t.Fatal(err)
		}
	}
	a.wantConversion(a.send(phoneN(5), from(5)...), ruleConversion, 3600, "paused")

	b := newBrowser(t, a.logs)
	b.do("open the page", chromedp.Navigate(a.admin.URL+"/"), chromedp.WaitVisible(chromedp.ID("token")))
	b.waitText("token-state", "No token given: the figures need one.")
	b.do("refresh without a token", chromedp.Click(chromedp.ID("budget-refresh")))
	b.waitText("status", "Give the admin token first.")

	b.do("a wrong token", chromedp.SendKeys(chromedp.ID("token"), "not the token"), chromedp.Click(chromedp.ID("token-use")))
	b.waitText("status", "The token was refused.")
	b.waitText("token-state", "No token given: the figures need one.") // a refused token is not kept
	if got := b.text("budget"); got != "Not read yet." {
		t.Errorf("budget with a wrong token: %q", got)
	}
	b.shot("admin-wrong-token-1280", 1280)

	b.do("the token", chromedp.SendKeys(chromedp.ID("token"), adminToken), chromedp.Click(chromedp.ID("token-use")))
	b.waitText("token-state", "A token is in use for this tab.")
	b.waitText("budget", "6 sent of 100 today (2026-01-01, UTC), 94 left; resets in 12 h.")
	b.waitText("prefixes-none", "1 paused.")
	if got := eval[string](b, `document.getElementById("prefixes").innerText`); !strings.Contains(got, "+8613900\t0 / 5\t1 h\tResume") {
		t.Errorf("paused prefixes %q; want +8613900, 0 / 5, 1 h, Resume", got)
	}
	if got := eval[string](b, `sessionStorage.getItem("smsAdminToken")`); got != adminToken {
		t.Errorf("sessionStorage holds %q; want the token", got)
	}

	b.do("look up", chromedp.SendKeys(chromedp.ID("phone"), "138 0013 8000"), chromedp.Click(chromedp.ID("look-up")))
	b.waitText("number-summary", number+" (CN, prefix +8613800); not locked out; a code is outstanding (expires in 5 min); its prefix is not paused.")
	rows := eval[string](b, `document.getElementById("guards").innerText`)
	for _, want := range []string{"number\tcooldown\t0\t1 min", "number\thourly\t4\tnow", "prefix\tprefix-hourly\t99999\tnow", "verify-failures\tverify-failures\t10\tnow"} {
		if !strings.Contains(rows, want) {
			t.Errorf("guards %q lack %q", rows, want)
		}
	}
	if body := eval[string](b, `document.documentElement.outerHTML`); strings.Contains(body, code) {
		t.Fatalf("the page shows the code %s", code)
	}
	b.shot("admin-number-1280", 1280)
	b.shot("admin-number-360", 360)

	b.do("reset", chromedp.Click(chromedp.ID("reset")))
	b.waitText("status", "The number's limits and lockout are reset.")
	b.wait("the cooldown lifted", `document.getElementById("guards").innerText.includes("number\tcooldown\t1\tnow")`)
	a.want(a.send(number), http.StatusAccepted, "a send after the page's reset")

	b.do("resume", chromedp.Evaluate[chromedp.Void](`document.querySelector("#prefixes button").click()`))
	b.waitText("status", "Prefix +8613900 resumed.")
	b.waitText("prefixes-none", "No prefix is paused.")
	a.want(a.send(phoneN(5), from(5)...), http.StatusAccepted, "a send after the page's resume")
	b.shot("admin-after-resume-1280", 1280)

	logs := a.logs.String()
	for _, want := range []string{`msg="admin: number reset" limits=number,verify-failures to=+86*******8000`, `msg="admin: prefix resumed"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the logs lack %s", want)
		}
	}
	if strings.Contains(logs, number) || strings.Contains(logs, code) {
		t.Errorf("the logs hold the number or the code:\n%s", logs)
	}
}
