package main

import (
	"fmt"
	"math"
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

// The page shows today's spend by country with each country's share, and
// the scopes the pools refused with the figures behind each refusal, as
// GET /api/spend and GET /api/pools give them.
func TestBrowserAdminSpendAndPools(t *testing.T) {
	a := newAdminEnv(t, moneyOn, func(c *Config) { c.Pools, c.Spend = defaultPools(), defaultSpend() })
	for i := range 30 { // one prefix, nothing verified: held by the pools
		a.send(fmt.Sprintf("+86138005%05d", i), "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", i))
	}
	var spend spendState
	a.api("GET", "/api/spend", "", &spend)
	var pools struct {
		On    bool        `json:"on"`
		Pools []poolState `json:"pools"`
	}
	a.api("GET", "/api/pools", "", &pools)
	if len(spend.Countries) != 1 || len(pools.Pools) == 0 || pools.Pools[0].Why == nil {
		t.Fatalf("spend %+v, pools %+v: want CN spent and a refusal", spend, pools)
	}
	cn, why := spend.Countries[0], pools.Pools[0].Why

	b := newBrowser(t, a.logs)
	b.do("open the page", chromedp.Navigate(a.admin.URL+"/"), chromedp.WaitVisible(chromedp.ID("token")))
	b.do("the token", chromedp.SendKeys(chromedp.ID("token"), adminToken), chromedp.Click(chromedp.ID("token-use")))
	b.waitText("spend", spend.Left+" USD left of 100.00 today ("+spend.Day+"), "+spend.OpenLeft+
		" of it outside the reserve; a country may spend 5.00 on codes not verified, and up to 16 times that as its codes are verified.")
	if got, want := eval[string](b, `document.getElementById("spend-countries").innerText`),
		"CN\t"+cn.Spent+"\t0.05\t"+cn.ShareLeft+" of "+cn.ShareCap; got != want {
		t.Errorf("spend by country %q; want %q", got, want)
	}
	b.waitText("pools-none", fmt.Sprintf("%d refused lately, 0 paused.", len(pools.Pools)))
	row := eval[string](b, `document.querySelector("#pools tr").innerText`)
	if why.Rule != rulePooledPending {
		t.Fatalf("the first refusal is %+v; want %s", why, rulePooledPending)
	}
	want := fmt.Sprintf("%s\tCN\t%s\theld\tpooled-conversion-pending: codes not verified yet\t%d / %d (%d open)\t%d%% / %d%%\tnot known",
		pools.Pools[0].Scope, pools.Pools[0].Prefix, why.Tally.Verified, why.Tally.Sent, why.Tally.Open,
		int(math.Round(100*why.Upper)), int(math.Round(100*why.Bar)))
	if row != want {
		t.Errorf("the first refusal reads %q; want %q", row, want)
	}
	b.shot("admin-spend-pools-1280", 1280)
	b.shot("admin-spend-pools-360", 360)
}
