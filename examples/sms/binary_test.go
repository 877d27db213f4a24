package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

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

// process is the service's binary, running.
type process struct {
	cmd            *exec.Cmd
	base           string // http://127.0.0.1:port
	stdout, stderr *lines
	exited         chan struct{} // closed when the process has ended
	waitErr        error         // its exit status, once exited is closed
}

// startBinary runs the service (serviceBinary) on a free loopback port with
// args, and env (KEY=value) added to the test's environment; it waits until
// the service serves. The process is killed when t ends, if still running.
func startBinary(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	bin := serviceBinary(t)

	p := &process{stdout: &lines{}, stderr: &lines{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"-addr", "127.0.0.1:0"}, args...)...) // the kernel's free port, no race for it
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	// If the test binary dies first, the kernel ends the server.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill() // by pid: only the process this test started
			<-p.exited
		}
	})
	m := p.stdout.await(t, regexp.MustCompile(`^sms: serving on (http://127\.0\.0\.1:[0-9]+)/$`), p.exited)
	p.base = m[1]
	return p
}

// stop ends the process with SIGTERM and fails t unless it exits cleanly
// within 5 s.
func (p *process) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		t.Fatalf("no exit 5 s after SIGTERM\nstderr:\n%s", p.stderr)
	}
	if p.waitErr != nil {
		t.Fatalf("exit after SIGTERM: %v; want status 0\nstderr:\n%s", p.waitErr, p.stderr)
	}
}

// The real binary, as the README runs it: embedded Redis, the curl session,
// and a clean exit on SIGTERM.
func TestBinary(t *testing.T) {
	p := startBinary(t, nil)
	base, stderr, exited := p.base, p.stderr, p.exited
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

	const sent = `{"number":"+8613800138000","country":"CN","retry_after":60}`
	if status, body := post("/api/sms/send", `{"phone":"+86 138 0013 8000"}`); status != http.StatusAccepted || body != sent {
		t.Fatalf("send = %d %s; want 202 %s\nstderr:\n%s", status, body, sent, stderr)
	}
	m := stderr.await(t, regexp.MustCompile(`^sms to=(\+[0-9]+) text=.*code is ([0-9]{6})\b`), exited)
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

	p.stop(t)
	if !strings.Contains(stderr.String(), "shutting down") {
		t.Errorf("stderr lacks the shutdown:\n%s", stderr)
	}
}
