package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// A script cache emptied under load (SCRIPT FLUSH, or a failover to a
// replica whose cache never held the scripts) costs each request at most one
// extra round trip per script, and never a 503: the service's own script
// (check.lua) and those of its guards and funnels go out as
// EVALSHA, and a NOSCRIPT reply is answered with the body (EVAL).

// direct serves one request to the service's handler in-process, from the
// client address remote, and returns the status and the reply: for
// goroutines other than the test's (unlike do, it never fails the test).
func (e *env) direct(remote, path string, body map[string]string) (int, reply, error) {
	j, err := json.Marshal(body)
	if err != nil {
		return 0, reply{}, err
	}
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(string(j)))
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr = remote
	w := httptest.NewRecorder()
	e.svc.Handler().ServeHTTP(w, req)
	var r reply
	if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil {
		return w.Code, r, fmt.Errorf("reply %q: %w", w.Body.String(), err)
	}
	return w.Code, r, nil
}

// lastCode returns the code of the last message to the E.164 number to.
func (p *capture) lastCode(to string) (string, error) {
	ms := p.messages()
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].to == to {
			if m := codeRE.FindStringSubmatch(ms[i].text); m != nil {
				return m[1], nil
			}
			return "", fmt.Errorf("message to %s has no code: %q", to, ms[i].text)
		}
	}
	return "", fmt.Errorf("no message to %s", to)
}

// sendAndVerify is one user's session, from the address remote: a code
// sent, a second send refused by the number's cooldown, a wrong code, the
// right one, and the right one again. Every answer must be the one the
// service gives with its scripts cached.
func (e *env) sendAndVerify(remote, phone string) error {
	step := func(what, path string, body map[string]string, want int, check func(reply) bool) error {
		status, r, err := e.direct(remote, path, body)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if status != want || (check != nil && !check(r)) {
			return fmt.Errorf("%s = %d %+v, want %d", what, status, r, want)
		}
		return nil
	}
	if err := step("send", "/api/sms/send", map[string]string{"phone": phone}, http.StatusAccepted, nil); err != nil {
		return err
	}
	cooldown := func(r reply) bool { return r.Scope == "number" && r.Rule == "cooldown" }
	if err := step("second send", "/api/sms/send", map[string]string{"phone": phone}, http.StatusTooManyRequests, cooldown); err != nil {
		return err
	}
	code, err := e.sms.lastCode(phone)
	if err != nil {
		return err
	}
	if err := step("wrong code", "/api/sms/verify", map[string]string{"phone": phone, "code": wrong(code, 0)}, http.StatusUnauthorized, nil); err != nil {
		return err
	}
	verified := func(r reply) bool { return r.Verified }
	if err := step("right code", "/api/sms/verify", map[string]string{"phone": phone, "code": code}, http.StatusOK, verified); err != nil {
		return err
	}
	return step("right code again", "/api/sms/verify", map[string]string{"phone": phone, "code": code}, http.StatusUnauthorized, nil)
}

// checkQuiet fails t for a warning or an error in the service's log (a
// refund that failed, a code that could not be stored).
func (e *env) checkQuiet(t *testing.T) {
	t.Helper()
	for _, line := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("the service logged: %s", line)
		}
	}
}

// TestScriptCacheLossUnderLoad runs the sessions of 64 users at once,
// several each, while another goroutine empties the script cache again and
// again: no request may fail, and every answer is the one the service gives
// with its scripts cached.
func TestScriptCacheLossUnderLoad(t *testing.T) {
	// Sessions per user: 64 x 2 and a flush every 3 make 42 flushes, in
	// about five seconds under -race on two cores; -short makes 32.
	const workers, minFlushes = 64, 20
	calls, every := 2, 3
	if testing.Short() {
		calls, every = 1, 2
	}
	srv := testutil.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 256})
	t.Cleanup(func() { c.Close() })
	stats := &testutil.ScriptStats{}
	c.AddHook(stats)
	e := newEnvOn(t, c, noIPLimits)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang, not a speed target
	defer cancel()
	load := testutil.FlushLoad(t, ctx, []string{srv.Addr}, workers, calls, every, func(_ context.Context, w, i int) error {
		// An address per user: the per-IP limits stay out of the way.
		return e.sendAndVerify(fmt.Sprintf("198.51.100.%d:4321", w), phoneN(w*100+i))
	})
	t.Logf("%d sessions (5 requests each), %d SCRIPT FLUSH during them; %v", load.Calls, load.Flushes, stats)
	load.Check(t, minFlushes)
	stats.Check(t, "the service's client", minFlushes)
	e.checkQuiet(t)
}

// TestScriptCacheLossCost runs a session serially right after a SCRIPT
// FLUSH and again: right after, each script it runs costs one extra round
// trip (EVALSHA answered NOSCRIPT, then EVAL), and nothing else changes;
// made again, it costs nothing extra.
func TestScriptCacheLossCost(t *testing.T) {
	srv := testutil.StartServer(t)
	c := srv.Client(t)
	rec := testutil.Record(c)
	e := newEnvOn(t, c)
	flush := func(ctx context.Context) error { return testutil.ScriptFlush(ctx, srv.Addr) }
	cost := testutil.FlushCostOf(t, flush, func(_ context.Context, run int) error {
		return e.sendAndVerify("198.51.100.1:4321", phoneN(run))
	}, rec)
	if !slices.ContainsFunc(rec.Commands(), isCheck) {
		t.Fatal("the session did not run check.lua")
	}
	t.Logf("a session right after SCRIPT FLUSH: %v; made again: none", cost)
	e.checkQuiet(t)
}
