package main

import (
	"errors"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The binary refuses tools without a token, or with a short one, and on an
// address other machines reach unless told; with a token on loopback it
// serves them.
func TestAdminBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := serviceBinary(t)
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
