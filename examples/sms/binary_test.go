package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// goTool returns the go command that builds the binary.
func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// lines collects a process's output and hands out complete lines.
type lines struct {
	mu      sync.Mutex
	partial []byte
	done    []string
	all     bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(p)
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.done = append(l.done, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all.String()
}

// await returns the submatches of the first line that matches re, waiting
// up to 10 s or until exited closes.
func (l *lines) await(t *testing.T, re *regexp.Regexp, exited <-chan struct{}) []string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		l.mu.Lock()
		for _, s := range l.done {
			if m := re.FindStringSubmatch(s); m != nil {
				l.mu.Unlock()
				return m
			}
		}
		l.mu.Unlock()
		select {
		case <-exited:
			t.Fatalf("the process exited before a line matching %s", re)
		case <-deadline:
			t.Fatalf("no line matching %s in 10 s", re)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// The real binary, as the README runs it: embedded Redis, the curl session,
// and a clean exit on SIGTERM.
func TestBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sms")
	build := exec.Command(goTool(t), "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	var stdout, stderr lines
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0") // the kernel's free port, no race for it
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// If the test binary dies first, the kernel ends the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill() // by pid: only the process this test started
			<-exited
		}
	})

	m := stdout.await(t, regexp.MustCompile(`^sms: serving on (http://127\.0\.0\.1:[0-9]+)/$`), exited)
	base := m[1]
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections() // no keep-alive goroutine outlives the test
	post := func(path, body string) (int, string) {
		t.Helper()
		res, err := client.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, strings.TrimSpace(string(b))
	}

	if status, body := post("/api/sms/send", `{"phone":"+86 138 0013 8000"}`); status != http.StatusAccepted || body != `{"retry_after":60}` {
		t.Fatalf("send = %d %s; want 202 {\"retry_after\":60}\nstderr:\n%s", status, body, &stderr)
	}
	m = stderr.await(t, regexp.MustCompile(`^sms to=(\+[0-9]+) text=.*code is ([0-9]{6})\b`), exited)
	if m[1] != number {
		t.Fatalf("message to %s; want %s", m[1], number)
	}
	code := m[2]
	if status, body := post("/api/sms/verify", `{"phone":"13800138000","code":"`+wrong(code, 0)+`"}`); status != http.StatusUnauthorized {
		t.Fatalf("wrong code = %d %s; want 401", status, body)
	}
	status, body := post("/api/sms/verify", `{"phone":"13800138000","code":"`+code+`"}`)
	var rep struct {
		Verified bool `json:"verified"`
	}
	if status != http.StatusOK || json.Unmarshal([]byte(body), &rep) != nil || !rep.Verified {
		t.Fatalf("verify = %d %s; want 200 {\"verified\":true}", status, body)
	}
	res, err := client.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("healthz = %d", res.StatusCode)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatalf("no exit 5 s after SIGTERM\nstderr:\n%s", &stderr)
	}
	if waitErr != nil {
		t.Fatalf("exit after SIGTERM: %v; want status 0\nstderr:\n%s", waitErr, &stderr)
	}
	if !strings.Contains(stderr.String(), "shutting down") {
		t.Errorf("stderr lacks the shutdown:\n%s", &stderr)
	}
}
