package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// RequireBrowserEnv names the variable that makes a missing chromium a
// failure (CI sets it).
const RequireBrowserEnv = "FUNNELGUARD_REQUIRE_BROWSER"

// ScreenshotsEnv names the directory the browser tests write their
// screenshots to; a temporary directory when it is unset.
const ScreenshotsEnv = "FUNNELGUARD_SCREENSHOTS"

// chromium returns Debian's chromium, or skips t without it (fails it when
// FUNNELGUARD_REQUIRE_BROWSER=1).
func chromium(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	const msg = "chromium is not on PATH: this test needs a browser (apt-get install chromium)"
	if os.Getenv(RequireBrowserEnv) == "1" {
		t.Fatalf("%s, and %s=1", msg, RequireBrowserEnv)
	}
	t.Skip(msg)
	return ""
}

// pollTimeout bounds every wait for the page: generous, so that a slow
// machine fails no test; the tests never assert speed.
const pollTimeout = 20 * time.Second

// timerProbe runs in the page before its own scripts and counts the live
// timers that app.js started (intervals, and timeouts not yet run; not the
// test's own, such as chromedp.Poll's), so that a test can see that none
// keeps running, without the page exposing anything.
const timerProbe = `(() => {
  const live = new Set();
  const fromPage = () => /\/app\.js:/.test(new Error().stack);
  const si = window.setInterval, st = window.setTimeout, ci = window.clearInterval, ct = window.clearTimeout;
  window.setInterval = function (f, ms, ...a) {
    const id = si.call(window, f, ms, ...a);
    if (fromPage()) live.add(id);
    return id;
  };
  window.setTimeout = function (f, ms, ...a) {
    const id = st.call(window, function (...b) { live.delete(id); if (typeof f === "function") f.apply(this, b); }, ms, ...a);
    if (fromPage()) live.add(id);
    return id;
  };
  window.clearInterval = function (id) { live.delete(id); return ci.call(window, id); };
  window.clearTimeout = function (id) { live.delete(id); return ct.call(window, id); };
  Object.defineProperty(window, "liveTimersForTest", { get: () => live.size });
})();`

// browser is a headless chromium with one tab, for one test: closed, with
// all its processes, when the test ends.
type browser struct {
	t    *testing.T
	ctx  context.Context
	logs fmt.Stringer // the server's log, shown when a step fails

	mu      sync.Mutex
	console []chromedp.ConsoleMessage
}

// newBrowser starts chromium (or skips t without it) with a 1280 px wide
// viewport and the timer probe in every page.
func newBrowser(t *testing.T, logs fmt.Stringer) *browser {
	t.Helper()
	execPath := chromium(t)
	dataDir := t.TempDir() // removed after the cleanup below: chromium is gone by then

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(execPath),
		chromedp.UserDataDir(dataDir),
		chromedp.Headless,
		chromedp.NoSandbox, // we run as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("font-render-hinting", "none"),
	)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	b := &browser{t: t, ctx: bctx, logs: logs}
	consoleDone := make(chan struct{})
	t.Cleanup(func() {
		// Close the browser, wait for it, and make sure none of its
		// processes outlives the test.
		if err := chromedp.Cancel(bctx); err != nil {
			t.Logf("close the browser: %v", err)
		}
		cancelBrowser()
		cancelAlloc()
		cancel()
		<-consoleDone
		if left := waitChromiumGone(dataDir, 5*time.Second); len(left) > 0 {
			t.Errorf("chromium processes %v outlived the browser; killed", left)
		}
	})
	if _, err := chromedp.Call(bctx, page.AddScriptToEvaluateOnNewDocument,
		page.AddScriptToEvaluateOnNewDocumentParams{Source: timerProbe}); err != nil {
		close(consoleDone)
		t.Fatalf("start chromium: %v", err)
	}
	messages := chromedp.Console(bctx)
	go func() {
		defer close(consoleDone)
		for m, err := range messages {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.console = append(b.console, m)
			b.mu.Unlock()
		}
	}()
	// Registered after the cleanup that closes the browser, so run before it.
	t.Cleanup(b.checkConsole)
	b.do("set the viewport", chromedp.EmulateViewport(1280, 800))
	return b
}

// failedLoad is how chromium logs an answer with an error status, which the
// page handles: not a fault of the page.
var failedLoad = regexp.MustCompile(`^Failed to load resource: the server responded with a status of (4[0-9][0-9]|50[23])\b`)

// checkConsole fails the test for any exception or error the page logged:
// a script or style that the Content-Security-Policy blocked, a script
// error.
func (b *browser) checkConsole() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.console {
		if m.Type != chromedp.ConsoleException && m.Type != chromedp.ConsoleError {
			continue
		}
		if m.Source == "network" && failedLoad.MatchString(m.Text) {
			continue
		}
		b.t.Errorf("the page logged %s (%s %s:%d)", m, m.Source, m.URL, m.Line)
	}
}

// do runs the steps, and fails the test with the page's status and the
// server's log if one fails.
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		status, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`(document.getElementById("status") || {}).textContent || ""`))
		var logs string
		if b.logs != nil {
			logs = b.logs.String()
		}
		b.t.Fatalf("%s: %v\nstatus: %q\nserver log:\n%s", what, err, status, logs)
	}
}

// wait waits until the JavaScript expression is true.
func (b *browser) wait(what, expr string) {
	b.t.Helper()
	b.do("wait for "+what, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(pollTimeout)))
}

// waitText waits until the element's text is want.
func (b *browser) waitText(id, want string) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, chromedp.Poll[chromedp.Void](
		fmt.Sprintf(`document.getElementById(%q).textContent === %q`, id, want),
		chromedp.WithPollingTimeout(pollTimeout))); err != nil {
		b.t.Fatalf("#%s reads %q; want %q (%v)", id, b.text(id), want, err)
	}
}

// text returns the element's text.
func (b *browser) text(id string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.getElementById(%q).textContent`, id)))
	if err != nil {
		b.t.Fatalf("text of #%s: %v", id, err)
	}
	return s
}

// eval evaluates the JavaScript expression.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// open loads the page and waits for its settings: the countries in the
// picker.
func (b *browser) open(url string) {
	b.t.Helper()
	b.do("open the page", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.ID("phone")))
	b.wait("the countries", `document.getElementById("country").options.length > 0 && !document.getElementById("send").disabled`)
}

// pick selects the region in the country picker as a person does: the
// change event follows.
func (b *browser) pick(region string) {
	b.t.Helper()
	b.do("pick "+region, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => {
		const s = document.getElementById("country");
		s.value = %q;
		if (s.value !== %[1]q) throw new Error("no option " + %[1]q);
		s.dispatchEvent(new Event("change", {bubbles: true}));
	})()`, region)))
}

// typeNumber empties the phone field (as select all, delete would) and
// types number.
func (b *browser) typeNumber(number string) {
	b.t.Helper()
	b.do("type "+number,
		chromedp.Evaluate[chromedp.Void](`(() => {
			const p = document.getElementById("phone");
			p.value = "";
			p.dispatchEvent(new Event("input", {bubbles: true}));
		})()`),
		chromedp.SendKeys(chromedp.ID("phone"), number))
}

// sendUsual sends a code to the tests' usual number, typed in national
// form with the default country, and waits for the page to say so.
func (b *browser) sendUsual() {
	b.t.Helper()
	b.typeNumber("138 0013 8000")
	b.do("send", chromedp.Click(chromedp.ID("send")))
	b.waitText("status", "Code sent to "+number+".")
}

// visible reports whether the element is shown (it and its ancestors are
// not hidden).
func (b *browser) visible(id string) bool {
	b.t.Helper()
	return eval[bool](b, fmt.Sprintf(`(() => { const e = document.getElementById(%q); return !!e && e.offsetParent !== null; })()`, id))
}

// waitDone waits for the finished state: the forms gone, the panel saying
// the number is verified.
func (b *browser) waitDone(number string) {
	b.t.Helper()
	b.wait("the finished state", `document.getElementById("done").offsetParent !== null`)
	if got, want := b.text("done-text"), number+" is verified. You can close this page."; got != want {
		b.t.Errorf("finished state %q; want %q", got, want)
	}
	for _, id := range []string{"send-form", "verify-form", "status-box"} {
		if b.visible(id) {
			b.t.Errorf("#%s still shown in the finished state", id)
		}
	}
}

// sendButton returns the send button's text and whether it is enabled.
func (b *browser) sendButton() (string, bool) {
	b.t.Helper()
	s := eval[struct {
		Text    string
		Enabled bool
	}](b, `(() => { const s = document.getElementById("send"); return {Text: s.textContent, Enabled: !s.disabled}; })()`)
	return s.Text, s.Enabled
}

// shot writes a full-page screenshot, name.png, to the screenshots
// directory, at width px (then back to 1280).
func (b *browser) shot(name string, width int64) {
	b.t.Helper()
	if width != 1280 {
		b.do("set the viewport", chromedp.EmulateViewport(width, 740, chromedp.EmulateMobile))
		defer b.do("set the viewport", chromedp.EmulateViewport(1280, 800))
	}
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	dir := screenshotDir(b.t)
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot %s", path)
}

// screenshotDir is $FUNNELGUARD_SCREENSHOTS, or a directory of t's.
func screenshotDir(t *testing.T) string {
	if d := os.Getenv(ScreenshotsEnv); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// tap records what a handler is asked and answers: the requests by method
// and path, and the bodies of requests and replies to the API's POSTs.
type tap struct {
	mu       sync.Mutex
	requests map[string]int // "GET /api/sms/outbox": count
	posts    []exchange
}

// exchange is one POST to the API and its answer.
type exchange struct {
	path   string
	body   string
	status int
	reply  reply
	raw    string
}

func (tp *tap) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tp.mu.Lock()
		if tp.requests == nil {
			tp.requests = map[string]int{}
		}
		tp.requests[r.Method+" "+r.URL.Path]++
		tp.mu.Unlock()
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		x := exchange{path: r.URL.Path, body: string(body), status: rec.status, raw: rec.buf.String()}
		_ = json.Unmarshal(rec.buf.Bytes(), &x.reply)
		tp.mu.Lock()
		tp.posts = append(tp.posts, x)
		tp.mu.Unlock()
	})
}

func (tp *tap) count(req string) int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.requests[req]
}

// last returns the last POST to path, and fails t if there was none.
func (tp *tap) last(t *testing.T, path string) exchange {
	t.Helper()
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for i := len(tp.posts) - 1; i >= 0; i-- {
		if tp.posts[i].path == path {
			return tp.posts[i]
		}
	}
	t.Fatalf("no POST %s reached the server", path)
	return exchange{}
}

// recorder is a ResponseWriter that keeps a copy of the answer.
type recorder struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
}

func (r *recorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(p []byte) (int, error) {
	r.buf.Write(p)
	return r.ResponseWriter.Write(p)
}

// tapped serves h through a new tap.
func tapped(t *testing.T, h http.Handler) (*httptest.Server, *tap) {
	tp := &tap{}
	srv := httptest.NewServer(tp.wrap(h))
	t.Cleanup(srv.Close)
	return srv, tp
}

// outboxService is a Service with the console provider and the demo outbox,
// the countries CN (the default), US and GB, on a fresh miniredis.
func outboxService(t *testing.T) (*Service, *syncBuffer) {
	t.Helper()
	b := testutil.Mini(t)
	b.Mini.SetTime(t0)
	cfg := testConfig()
	cfg.DemoOutbox = true
	cfg.Countries = []string{"CN", "US", "GB"}
	logs := &syncBuffer{}
	svc, err := NewService(b.Client(t), cfg, &ConsoleProvider{out: io.Discard}, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatalf("NewService: %v", err)
	}
	return svc, logs
}

func threeCountries(c *Config) { c.Countries = []string{"CN", "US", "GB"} }

// The page in a real browser: a number typed with + (the picker ignored),
// send, the countdown from the server's retry_after, the code from the
// provider, "Verified.".
func TestBrowser(t *testing.T) {
	e := newEnv(t)
	b := newBrowser(t, e.logs)
	b.open(e.srv.URL + "/")
	b.typeNumber("+86 138 0013 8000")
	b.waitText("e164", "+86 13800138000")
	sent := time.Now() // the countdown starts after this
	b.do("send", chromedp.Click(chromedp.ID("send")))
	b.waitText("status", "Code sent to "+number+".")
	b.wait("the countdown", `document.getElementById("send").textContent.startsWith("Resend in ")`)
	text, enabled := b.sendButton()
	if enabled {
		t.Fatalf("after send: the button %q is enabled; want it disabled during the countdown", text)
	}
	// The server gave 60 s: "1 min", then "59 s" and down. The page counts
	// down in real time: allow for the seconds this took, however slow the
	// browser, rather than assume it took under five.
	if text != "Resend in 1 min" {
		m := regexp.MustCompile(`^Resend in ([0-9]+) s$`).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("after send: button %q; want \"Resend in 1 min\" or \"Resend in N s\"", text)
		}
		if n, _ := strconv.Atoi(m[1]); n >= 60 || n < 60-int(time.Since(sent)/time.Second)-1 {
			t.Fatalf("countdown at %d s, %v after the send; want it from the 60 s the server gave", n, time.Since(sent).Round(time.Second))
		}
	}
	b.do("verify", chromedp.SendKeys(chromedp.ID("code"), e.sms.code(t, number)), chromedp.Click(chromedp.ID("verify")))
	b.waitDone(number)
}

// The country picker: its options come from the settings, the default
// region first and selected; the number is read in the country picked, as
// the preview shows and the server's answers prove.
func TestBrowserCountryPicker(t *testing.T) {
	e := newEnv(t, threeCountries)
	srv, tp := tapped(t, e.svc.Handler())
	b := newBrowser(t, e.logs)
	b.open(srv.URL + "/")

	type option struct{ Value, Text string }
	opts := eval[[]option](b, `[...document.getElementById("country").options].map(o => ({Value: o.value, Text: o.text}))`)
	want := []option{{"CN", "China (+86)"}, {"GB", "United Kingdom (+44)"}, {"US", "United States (+1)"}}
	if fmt.Sprint(opts) != fmt.Sprint(want) {
		t.Fatalf("country options %v; want %v (the settings' countries, the default first)", opts, want)
	}
	if v := eval[string](b, `document.getElementById("country").value`); v != "CN" {
		t.Fatalf("country picked %q; want the default region CN", v)
	}
	if got := b.text("e164"); got != "+86" {
		t.Errorf("preview of an empty number %q; want \"+86\"", got)
	}
	b.shot("initial-1280", 1280)
	b.shot("initial-360", 360)

	// What the server cannot read as a number gets no preview: no "Read as
	// +86" under letters, or under a number with a letter in it.
	for _, typed := range []string{"abc", "138 0013 800O"} {
		b.typeNumber(typed)
		b.wait("no preview of "+typed, `document.getElementById("e164-line").hidden`)
	}

	// A number typed with + wins over the picker.
	b.typeNumber("+44 7911 123456")
	b.waitText("e164", "+44 7911123456")
	b.wait("the preview", `!document.getElementById("e164-line").hidden`)

	// 415 555 2673 is a landline in China, and a mobile-or-fixed number
	// (allowed) in the United States: the 202 and the message to
	// +14155552673 prove the server read it in the country picked.
	b.pick("US")
	b.typeNumber("415 555 2673")
	b.waitText("e164", "+1 4155552673")
	b.do("send", chromedp.Click(chromedp.ID("send")))
	b.waitText("status", "Code sent to +14155552673.")
	x := tp.last(t, "/api/sms/send")
	var req struct{ Phone, Country string }
	if err := json.Unmarshal([]byte(x.body), &req); err != nil || req.Phone != "415 555 2673" || req.Country != "US" {
		t.Errorf("the page sent %s; want the number as typed and country US (%v)", x.body, err)
	}
	if ms := e.sms.messages(); len(ms) != 1 || ms[0].to != "+14155552673" {
		t.Errorf("messages sent %v; want one to +14155552673", ms)
	}

	// A UK landline, with the United Kingdom picked, and its trunk 0
	// dropped in the preview: the server's 422 sentence, word for word.
	// Changing the number ends the wait for the other one.
	b.pick("GB")
	b.typeNumber("020 7946 0018")
	b.waitText("e164", "+44 2079460018")
	b.wait("the send button", `!document.getElementById("send").disabled`)
	b.do("send", chromedp.Click(chromedp.ID("send")))
	b.wait("the answer", `document.getElementById("status").textContent.includes("landline")`)
	x = tp.last(t, "/api/sms/send")
	if x.status != http.StatusUnprocessableEntity || x.reply.Reason != "landline" {
		t.Fatalf("send of a UK landline: %d %s; want 422 with reason landline", x.status, x.raw)
	}
	if got, want := b.text("status"), "+442079460018 is a landline, which cannot receive text messages."; got != want {
		t.Errorf("status %q; want %q, the server's reason in words", got, want)
	}
	if got, want := b.text("next"), "Give a mobile number."; got != want {
		t.Errorf("next step %q; want %q", got, want)
	}
	if text, enabled := b.sendButton(); !enabled || text != "Send code" {
		t.Errorf("after a 422: send button %q (enabled %v); want \"Send code\", enabled", text, enabled)
	}
	b.shot("422-1280", 1280)
	b.shot("422-360", 360)
}

// A 429 shows its wait in human units, in the status and on the button,
// computed from the server's retry_after.
func TestBrowserHumanWait(t *testing.T) {
	for _, tc := range []struct {
		cooldown time.Duration
		words    string // the wait in the status, at the server's retry_after
	}{
		{47 * time.Minute, "47 min"},
		{125 * time.Minute, "2 h 5 min"},
		{45 * time.Second, "45 s"},
	} {
		t.Run(tc.words, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.Cooldown = tc.cooldown })
			srv, tp := tapped(t, e.svc.Handler())
			b := newBrowser(t, e.logs)
			b.open(srv.URL + "/")
			b.sendUsual()

			// The person reloads the page, which forgets the countdown,
			// and asks again: the server refuses, within the cooldown.
			b.open(srv.URL + "/")
			b.typeNumber("138 0013 8000")
			asked := time.Now()
			b.do("send again", chromedp.Click(chromedp.ID("send")))
			b.wait("the 429", `document.getElementById("status").textContent.startsWith("Too many")`)
			x := tp.last(t, "/api/sms/send")
			if x.status != http.StatusTooManyRequests || x.reply.Scope != "number" || x.reply.RetryAfter == nil {
				t.Fatalf("second send: %d %s; want a 429 of scope number with retry_after", x.status, x.raw)
			}
			wait := *x.reply.RetryAfter
			if got := humanWait(wait); got != tc.words {
				t.Fatalf("retry_after %d reads %q; want %q (is the test's cooldown right?)", wait, got, tc.words)
			}
			if got, want := b.text("status"), "Too many codes for this number: try again in "+humanWait(wait)+"."; got != want {
				t.Errorf("status %q; want %q", got, want)
			}
			// A long wait says when to come back (not a demo: no reset to
			// point to); a short one is only counted down.
			next := eval[string](b, `(() => { const n = document.getElementById("next"); return n.hidden ? "" : n.textContent; })()`)
			if long := wait >= 120; long != regexp.MustCompile(`^Come back (tomorrow )?at [0-9]{1,2}:[0-9]{2}( [AP]M)? or later\.$`).MatchString(next) {
				t.Errorf("next step after a wait of %d s: %q; want \"Come back at HH:MM or later.\" only for a wait of 2 min or more", wait, next)
			}
			if visible := eval[bool](b, `document.getElementById("demo").offsetParent !== null`); visible {
				t.Errorf("the demo's reset is shown outside a demo")
			}
			// The button counts down from retry_after in the browser's
			// time: any wait from then to now is right.
			text, enabled := b.sendButton()
			ok := false
			for s := wait; s >= wait-int64(time.Since(asked)/time.Second)-1 && !ok; s-- {
				ok = text == "Resend in "+humanWait(s)
			}
			if !ok || enabled {
				t.Errorf("send button %q (enabled %v), %v after the send; want a disabled \"Resend in %s\"",
					text, enabled, time.Since(asked).Round(time.Second), humanWait(wait))
			}
			if tc.cooldown == 47*time.Minute {
				b.shot("429-1280", 1280)
			}
		})
	}
}

// Once verified, the countdown stops: the send button is back to "Send
// code", enabled, no timer is left, and the button stays so.
func TestBrowserCountdownStopsOnceVerified(t *testing.T) {
	e := newEnv(t)
	b := newBrowser(t, e.logs)
	b.open(e.srv.URL + "/")
	b.sendUsual()
	b.wait("the countdown", `document.getElementById("send").textContent.startsWith("Resend in ")`)
	if n := eval[int](b, `window.liveTimersForTest`); n == 0 {
		t.Fatalf("no live timer during the countdown: the timer probe does not see the page's timers")
	}

	b.do("verify", chromedp.SendKeys(chromedp.ID("code"), e.sms.code(t, number)), chromedp.Click(chromedp.ID("verify")))
	b.waitDone(number)
	check := func(when string) {
		t.Helper()
		if text, enabled := b.sendButton(); text != "Send code" || !enabled {
			t.Errorf("%s: send button %q (enabled %v); want \"Send code\", enabled", when, text, enabled)
		}
		if n := eval[int](b, `window.liveTimersForTest`); n != 0 {
			t.Errorf("%s: %d timers still running; want none", when, n)
		}
	}
	check("once verified")
	b.shot("verified-1280", 1280)
	// A countdown left running would rewrite the button within a second.
	b.do("wait", chromedp.Sleep(2500*time.Millisecond))
	check("2.5 s after")
	b.waitDone(number)
}

// The demo outbox: with the console provider and DemoOutbox, the page lists
// the message sent, and the code read there verifies.
func TestBrowserOutbox(t *testing.T) {
	svc, logs := outboxService(t)
	srv, tp := tapped(t, svc.Handler())
	b := newBrowser(t, logs)
	b.open(srv.URL + "/")
	b.wait("the outbox", `!document.getElementById("outbox").hidden && document.getElementById("outbox").offsetParent !== null`)
	b.sendUsual()
	b.wait("the message in the outbox", `[...document.querySelectorAll("#outbox li")].some(li => li.textContent.includes("+8613800138000"))`)
	msgs := eval[[]struct{ To, Text string }](b,
		`[...document.querySelectorAll("#outbox li")].map(li => ({To: li.querySelector(".to").textContent, Text: li.querySelector(".text").textContent}))`)
	if len(msgs) != 1 || msgs[0].To != number {
		t.Fatalf("outbox lists %v; want one message to %s", msgs, number)
	}
	m := codeRE.FindStringSubmatch(msgs[0].Text)
	if m == nil {
		t.Fatalf("outbox message %q has no code", msgs[0].Text)
	}
	if n := tp.count("GET /api/sms/outbox"); n == 0 {
		t.Errorf("the page showed the outbox without asking GET /api/sms/outbox?")
	}
	b.shot("outbox-1280", 1280)
	b.shot("outbox-360", 360)

	b.do("verify", chromedp.SendKeys(chromedp.ID("code"), m[1]), chromedp.Click(chromedp.ID("verify")))
	b.waitDone(number)
	b.shot("outbox-verified-1280", 1280)
}

// Without the demo outbox, the page shows no outbox and never asks for it.
func TestBrowserNoOutbox(t *testing.T) {
	e := newEnv(t)
	srv, tp := tapped(t, e.svc.Handler())
	b := newBrowser(t, e.logs)
	b.open(srv.URL + "/")
	b.sendUsual()
	if visible := eval[bool](b, `(() => { const o = document.getElementById("outbox"); return !!o && o.offsetParent !== null; })()`); visible {
		t.Errorf("the outbox is visible without DemoOutbox")
	}
	if n := tp.count("GET /api/sms/outbox"); n != 0 {
		t.Errorf("the page asked GET /api/sms/outbox %d times; want never, as settings.outbox is false", n)
	}
	if n := tp.count("GET /api/sms/settings"); n != 1 {
		t.Errorf("GET /api/sms/settings asked %d times; want once (is the tap seeing the page?)", n)
	}
}

// waitChromiumGone waits up to d for the processes that use the user data
// directory dir to end, then kills any left (they are this test's: the
// directory is its own) and returns their pids.
func waitChromiumGone(dir string, d time.Duration) []int {
	deadline := time.Now().Add(d)
	for {
		pids := chromiumUsing(dir)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			return pids
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// chromiumUsing returns the pids of the processes started with
// --user-data-dir=dir.
func chromiumUsing(dir string) []int {
	want := []byte("--user-data-dir=" + dir)
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, arg := range bytes.Split(cmdline, []byte{0}) {
			if bytes.Equal(arg, want) {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}
