package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// A hung Redis: redis-server stopped with SIGSTOP. Its port still accepts
// connections and commands, and nothing answers. The service must answer a
// request by its Redis timeout (-redis-timeout) plus a small margin: 503
// Service Unavailable with Retry-After, never a request that hangs for
// go-redis's ReadTimeout or for ever.

const (
	// hungTimeout is the service's -redis-timeout in these tests.
	hungTimeout = 300 * time.Millisecond
	// hungMargin is what a request may take past the timeouts it waits for.
	hungMargin = 200 * time.Millisecond
	// hungHang bounds each request of these tests: a hang, not a measurement.
	hungHang = 20 * time.Second
)

// hungAnswer is one HTTP answer, how long it took (request sent to body
// read), and the longest time a thread of the service's process waited for
// a CPU meanwhile (see testutil.CPUWaits).
type hungAnswer struct {
	status  int
	header  http.Header
	body    string
	took    time.Duration
	starved time.Duration
}

func (a hungAnswer) String() string {
	return fmt.Sprintf("%d %s (Retry-After %q) after %v (a thread of the service waited up to %v for a CPU)",
		a.status, strings.TrimSpace(a.body), a.header.Get("Retry-After"), a.took, a.starved)
}

// hungDo sends a request (a JSON body, unless body is empty) to the
// service, which runs in the process pid ("self": this one), and times it.
// It runs in the test's goroutine; client must bound it (hungHang).
func hungDo(t *testing.T, client *http.Client, pid, method, url, body string) hungAnswer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	before := testutil.CPUWaits(pid)
	start := time.Now()
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: no answer after %v: %v", method, url, time.Since(start), err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, url, err)
	}
	return hungAnswer{status: res.StatusCode, header: res.Header, body: string(raw), took: took, starved: testutil.Starved(before, testutil.CPUWaits(pid))}
}

// hungFigure records a figure in the form RELIABILITY.md collects (see
// faultFigure in internal/reliability).
func hungFigure(t *testing.T, property, fault, format string, a ...any) {
	t.Helper()
	t.Logf("FIGURE %s | %s | %s", property, fault, strings.ReplaceAll(fmt.Sprintf(format, a...), "\n", "; "))
}

// hungRetryAfter checks that a carries Retry-After in whole seconds >= 1.
func hungRetryAfter(t *testing.T, what string, a hungAnswer) {
	t.Helper()
	if sec, err := strconv.ParseInt(a.header.Get("Retry-After"), 10, 64); err != nil || sec < 1 {
		t.Errorf("%s: %v; want a Retry-After of whole seconds >= 1", what, a)
	}
}

// The binary, as the README runs it on a real Redis, with -redis-timeout
// 300ms: once the server hangs, a send is answered 503 with Retry-After
// within the timeout plus 200 ms; so are a verification and the health check
// (without Retry-After: it is not a request to retry). Once the server
// continues, sends are admitted again.
func TestHungRedisBinary(t *testing.T) {
	srv := testutil.StartServer(t)
	p := startBinary(t, nil, "-redis", "redis://"+srv.Addr+"/0", "-redis-timeout", hungTimeout.String())
	pid := strconv.Itoa(p.cmd.Process.Pid)
	client := &http.Client{Timeout: hungHang}
	defer client.CloseIdleConnections() // no keep-alive goroutine outlives the test
	send := func(phone string) hungAnswer {
		return hungDo(t, client, pid, "POST", p.base+"/api/sms/send", `{"phone":"`+phone+`"}`)
	}
	// While the server answers: a code is sent, so the scripts are cached,
	// the connections open, and the number and the address have state.
	if a := send("+86 138 0013 8000"); a.status != http.StatusAccepted {
		t.Fatalf("send before the stop: %v\nstderr:\n%s", a, p.stderr)
	}

	thaw := testutil.Freeze(t, srv.Pid())
	fault := fmt.Sprintf("%s SIGSTOPped, the binary with -redis-timeout %v, bound +%v", testutil.ServerName(), hungTimeout, hungMargin)
	for _, tc := range []struct {
		name, method, path, body string
		retryAfter               bool
	}{
		{"send", "POST", "/api/sms/send", `{"phone":"+86 139 0013 9000"}`, true},
		{"send (the number that has a code)", "POST", "/api/sms/send", `{"phone":"+86 138 0013 8000"}`, true},
		{"verify", "POST", "/api/sms/verify", `{"phone":"+86 138 0013 8000","code":"000000"}`, true},
		{"healthz", "GET", "/healthz", "", false},
	} {
		a := hungDo(t, client, pid, tc.method, p.base+tc.path, tc.body)
		t.Logf("%s: %v", tc.name, a)
		if a.status != http.StatusServiceUnavailable {
			t.Errorf("%s on a hung Redis: %v; want 503", tc.name, a)
		}
		if tc.retryAfter {
			hungRetryAfter(t, tc.name, a)
		}
		if a.took-a.starved > hungTimeout+hungMargin { // the CPU waits of a loaded machine are not the service's (see hungJudge)
			t.Errorf("%s on a hung Redis took %v: over -redis-timeout %v + %v (a thread of the service waited up to %v for a CPU meanwhile)",
				tc.name, a.took, hungTimeout, hungMargin, a.starved)
		}
		hungFigure(t, "hung Redis: "+tc.method+" "+tc.path+" ("+tc.name+") answered "+strconv.Itoa(a.status)+" after", fault,
			"%v (%v past the timeout; a thread of the service waited up to %v for a CPU)", a.took.Round(100*time.Microsecond),
			(a.took - hungTimeout).Round(100*time.Microsecond), a.starved.Round(100*time.Microsecond))
	}

	// The server continues: sends are admitted again. Attempts sent to it
	// while it was stopped may run now and hold the address's lock, under a
	// token nobody has, for their lease: the first sends may still fail.
	thaw()
	thawed := time.Now()
	var last hungAnswer
	refused := map[int]int{} // status -> count, before the first admission
	for i := 0; ; i++ {
		last = send(fmt.Sprintf("+86139%08d", 100+i))
		if last.status == http.StatusAccepted {
			break
		}
		refused[last.status]++
		if time.Since(thawed) > 10*time.Second {
			t.Fatalf("no send admitted 10 s after the server continued; last: %v\nstderr:\n%s", last, p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	hungFigure(t, "hung Redis: first send admitted after the server continues", testutil.ServerName()+" SIGSTOPped then SIGCONTed, the binary with -redis-timeout "+hungTimeout.String(),
		"%v (answers before it, by status: %v)", time.Since(thawed).Round(time.Millisecond), refused)
	p.stop(t)
}

// stopHook stops the server (SIGSTOP, by pid) once, at the first command or
// pipeline match accepts: before it is sent, or with after, once its reply
// has come. The test continues the server when it ends.
type stopHook struct {
	pid   int
	match func(cmds []redis.Cmder) bool
	after bool
	armed atomic.Bool
	at    atomic.Int64 // when it stopped the server (UnixNano), 0 before
}

func (h *stopHook) fire(cmds []redis.Cmder) {
	if h.armed.Load() && h.match(cmds) && h.armed.CompareAndSwap(true, false) {
		_ = syscall.Kill(h.pid, syscall.SIGSTOP)
		h.at.Store(time.Now().UnixNano())
	}
}

func (h *stopHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *stopHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !h.after {
			h.fire([]redis.Cmder{cmd})
		}
		err := next(ctx, cmd)
		if h.after && err == nil {
			h.fire([]redis.Cmder{cmd})
		}
		return err
	}
}

func (h *stopHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !h.after {
			h.fire(cmds)
		}
		err := next(ctx, cmds)
		if h.after && err == nil {
			h.fire(cmds)
		}
		return err
	}
}

// hasCmd matches a command or pipeline that holds a command named name.
func hasCmd(name string) func([]redis.Cmder) bool {
	return func(cmds []redis.Cmder) bool {
		for _, c := range cmds {
			if c.Name() == name {
				return true
			}
		}
		return false
	}
}

// alone matches a command named name sent alone (not in a pipeline).
func alone(name string) func([]redis.Cmder) bool {
	return func(cmds []redis.Cmder) bool { return len(cmds) == 1 && cmds[0].Name() == name }
}

// runs matches a run of script (EVALSHA or EVAL) alone.
func runs(script *redis.Script, src string) func([]redis.Cmder) bool {
	return func(cmds []redis.Cmder) bool {
		if len(cmds) != 1 {
			return false
		}
		args := cmds[0].Args()
		if len(args) < 2 {
			return false
		}
		switch cmds[0].Name() {
		case "evalsha":
			return args[1] == script.Hash()
		case "eval":
			return args[1] == src
		}
		return false
	}
}

// The server hangs in the middle of a request, after the guards admitted
// it, in the service itself (no binary: a hook on the client the binary
// would build, connect's, stops the server at the right command). Every
// Redis call the service makes after that is bounded by its Timeout, so the
// answer comes within the sum of the Timeouts of the calls left, plus the
// margin: not after go-redis's ReadTimeout (3 s) and its retries.
func TestHungRedisMidRequest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		match func([]redis.Cmder) bool
		after bool
		fail  bool // the provider refuses the message
		// verify: send a code first, then verify it while the server hangs
		// (with wrong, a wrong code)
		verify, wrong bool
		status        int
		// calls is how many Redis calls, each bounded by the Timeout, wait
		// for the hung server.
		calls int
	}{
		// The code is stored (MULTI DEL HSET EXPIRE EXEC): the put fails,
		// the four guards are refunded, at once, 503.
		{name: "send: storing the code", match: hasCmd("hset"), status: http.StatusServiceUnavailable, calls: 2},
		// The provider refused the message: its code is forgotten (DEL
		// alone; the put's DEL is in its MULTI), the four guards are
		// refunded at once, 502.
		{name: "send: forgetting an unsent code", match: alone("del"), fail: true, status: http.StatusBadGateway, calls: 2},
		// A wrong code was compared; the server hangs before the number's
		// daily failure is counted: the guess is not answered as an
		// ordinary wrong code, 503.
		{name: "verify: counting a wrong code", match: runs(checkScript, checkSrc), after: true, verify: true, wrong: true, status: http.StatusServiceUnavailable, calls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testutil.StartServer(t)
			client, stop, err := connect("redis://"+srv.Addr+"/0", slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(stop)
			// Continued before the client closes and the server stops
			// (cleanups run in reverse), whatever happens.
			t.Cleanup(func() { _ = syscall.Kill(srv.Pid(), syscall.SIGCONT) })
			hook := &stopHook{pid: srv.Pid(), match: tc.match, after: tc.after}
			client.AddHook(hook)
			e := newEnvOn(t, client, func(c *Config) { c.Timeout = hungTimeout })
			httpc := &http.Client{Timeout: hungHang}
			defer httpc.CloseIdleConnections()

			// While the server answers: a code to another number (the
			// scripts cached, the connections open). A loaded machine can
			// take the first send past the 300 ms Timeout: another number
			// then, until one is sent warm.
			for i := 1; ; i++ {
				r := e.send(phoneN(i))
				if r.status == http.StatusAccepted {
					break
				}
				if i == 5 {
					t.Fatalf("send before the stop, 5 numbers: %v\nlogs:\n%s", r, e.logs)
				}
			}
			url, body := e.srv.URL+"/api/sms/send", `{"phone":"`+number+`"}`
			if tc.verify {
				if r := e.send(number); r.status != http.StatusAccepted {
					t.Fatalf("send before the stop: %v\nlogs:\n%s", r, e.logs)
				}
				code := e.sms.code(t, number)
				if tc.wrong {
					code = wrong(code, 0)
				}
				url, body = e.srv.URL+"/api/sms/verify", `{"phone":"`+number+`","code":"`+code+`"}`
			}
			e.sms.fail(tc.fail)

			hook.armed.Store(true)
			start := time.Now()
			a := hungDo(t, httpc, "self", "POST", url, body)
			at := hook.at.Load()
			if at == 0 {
				t.Fatalf("the server was never stopped: the request made no matching command (%v)\nlogs:\n%s", a, e.logs)
			}
			t.Logf("%v (server stopped %v into the request)\nlogs:\n%s", a, time.Unix(0, at).Sub(start), e.logs)
			if a.status != tc.status {
				t.Errorf("%v; want %d", a, tc.status)
			}
			if a.status == http.StatusServiceUnavailable {
				hungRetryAfter(t, tc.name, a)
			}
			bound := time.Duration(tc.calls)*hungTimeout + hungMargin
			if a.took-a.starved > bound {
				t.Errorf("answered after %v: over %d Redis call(s) of the Timeout %v + %v (a thread waited up to %v for a CPU meanwhile)",
					a.took, tc.calls, hungTimeout, hungMargin, a.starved)
			}
			hungFigure(t, "hung Redis mid-request: "+tc.name+", answered "+strconv.Itoa(a.status)+" after",
				fmt.Sprintf("%s SIGSTOPped at that command, Timeout %v, %d bounded call(s) left, bound %v", testutil.ServerName(), hungTimeout, tc.calls, bound),
				"%v (a thread waited up to %v for a CPU)", a.took.Round(100*time.Microsecond), a.starved.Round(100*time.Microsecond))
		})
	}
}
