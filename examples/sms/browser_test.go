package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// RequireBrowserEnv names the variable that makes a missing chromium a
// failure (CI sets it).
const RequireBrowserEnv = "FUNNELGUARD_REQUIRE_BROWSER"

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

// The page in a real browser: send, the countdown from Retry-After, the
// code from the provider, "Verified.".
func TestBrowser(t *testing.T) {
	execPath := chromium(t)
	e := newEnv(t)
	dataDir := t.TempDir()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
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
	)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer func() {
		// Close the browser, wait for it, and make sure none of its processes
		// outlives the test.
		if err := chromedp.Cancel(bctx); err != nil {
			t.Logf("close the browser: %v", err)
		}
		cancelBrowser()
		cancelAlloc()
		if left := waitChromiumGone(dataDir, 5*time.Second); len(left) > 0 {
			t.Errorf("chromium processes %v outlived the browser; killed", left)
		}
	}()

	phone, send, code, verify, status := chromedp.ID("phone"), chromedp.ID("send"), chromedp.ID("code"), chromedp.ID("verify"), chromedp.ID("status")
	statusText := func() string {
		s, _ := chromedp.Run(bctx, chromedp.Text(status))
		return s
	}
	sent := time.Now() // the countdown starts after this
	err := chromedp.Do(bctx,
		chromedp.Navigate(e.srv.URL+"/"),
		chromedp.WaitVisible(phone),
		chromedp.SendKeys(phone, "+86 138 0013 8000"),
		chromedp.Click(send),
		chromedp.Poll[chromedp.Void](`document.getElementById("send").textContent.startsWith("Resend in ")`,
			chromedp.WithPollingTimeout(10*time.Second)),
	)
	if err != nil {
		t.Fatalf("send: %v; status %q\nlogs:\n%s", err, statusText(), e.logs)
	}
	sendText, err := chromedp.Run(bctx, chromedp.Text(send))
	if err != nil {
		t.Fatal(err)
	}
	disabled, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`document.getElementById("send").disabled`))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^Resend in ([0-9]+) s$`).FindStringSubmatch(sendText)
	if st := statusText(); m == nil || !disabled || st != "Code sent." {
		t.Fatalf("after send: button %q (disabled %v), status %q; want a disabled \"Resend in N s\" and \"Code sent.\"", sendText, disabled, st)
	}
	// The page counts down in real time: allow for the seconds this took,
	// however slow the browser, rather than assume it took under five.
	if n, _ := strconv.Atoi(m[1]); n > 60 || n < 60-int(time.Since(sent)/time.Second)-1 {
		t.Fatalf("countdown at %d s, %v after the send; want it from the 60 s the server gave", n, time.Since(sent).Round(time.Second))
	}

	err = chromedp.Do(bctx,
		chromedp.SendKeys(code, e.sms.code(t, number)),
		chromedp.Click(verify),
		chromedp.Poll[chromedp.Void](`document.getElementById("status").textContent === "Verified."`,
			chromedp.WithPollingTimeout(10*time.Second)),
	)
	if err != nil {
		t.Fatalf("verify: %v; status %q\nlogs:\n%s", err, statusText(), e.logs)
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
