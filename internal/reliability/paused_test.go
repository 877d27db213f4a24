package reliability

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// A paused holder: a second process (this test binary, re-executed) takes a
// lock, reads, says so on stdout and waits for a line on stdin before it
// commits; the test stops it with SIGSTOP past its lease (its renewals and
// timers freeze with it, as in a GC pause or a stalled VM), takes the lock
// and writes, then continues it with SIGCONT and lets it commit. The stale
// commit must not land.

// Environment of the helper process.
const (
	helperEnv       = "FUNNELGUARD_RELIABILITY_HELPER" // the helper's mode
	helperAddrEnv   = "FUNNELGUARD_RELIABILITY_ADDR"
	helperPrefixEnv = "FUNNELGUARD_RELIABILITY_PREFIX"
)

// faultHelperLease is the helper's lease: short, so that the stop outlasts it.
const faultHelperLease = 300 * time.Millisecond

// faultRule admits one unit a day: what the stale holder decided cannot
// leak away during the test.
var faultRule = funnel.Rule{Name: "day", Capacity: 1, Leak: 1, Per: 24 * time.Hour}

// TestHelperProcess is the paused holder when run as a helper (helperEnv
// set); otherwise it does nothing. It exits the process itself.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	err := runFaultHelper(mode, os.Getenv(helperAddrEnv), os.Getenv(helperPrefixEnv))
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// faultGateHook blocks the first script call that follows a successful one
// (the commit after the read) until the test says "go" on stdin, and counts
// the script calls made after that.
type faultGateHook struct {
	gate func()

	mu       sync.Mutex // renewals run scripts from their own goroutine
	readDone bool
	blocked  bool
	after    int
}

// commitNext makes the next script calls count as the commit's, without
// the gate.
func (h *faultGateHook) commitNext() {
	h.mu.Lock()
	h.blocked, h.after = true, 0
	h.mu.Unlock()
}

func (h *faultGateHook) sent() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.after
}

func (h *faultGateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *faultGateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *faultGateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		script := cmd.Name() == "evalsha" || cmd.Name() == "eval"
		if !script {
			return next(ctx, cmd)
		}
		h.mu.Lock()
		gate := h.readDone && !h.blocked
		if gate {
			h.blocked = true
		}
		h.mu.Unlock()
		if gate {
			h.gate()
		}
		h.mu.Lock()
		if h.blocked {
			h.after++
		}
		h.mu.Unlock()
		err := next(ctx, cmd)
		if err == nil {
			h.mu.Lock()
			h.readDone = true
			h.mu.Unlock()
		}
		return err
	}
}

// runFaultHelper is the helper's work in mode:
//
//   - "commit": Lock with a plain lease, read the counter, commit v+1 with
//     UnlockWith after "go"; the handle has no deadline timer (nothing watches
//     Done), so the commit goes to Redis, whose script must refuse it.
//   - "renew": the same with WithAutoRenew and Context watched: when the process
//     continues, the renewal and the deadline timer race the commit.
//   - "funnel": funnel AllowN of one unit under faultRule; the commit (the
//     script after the read) waits for "go".
//
// It prints "ready ..." when it waits and "result ..." at the end.
func runFaultHelper(mode, addr, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stdin := bufio.NewScanner(os.Stdin)
	waitGo := func() {
		if !stdin.Scan() || stdin.Text() != "go" {
			fmt.Printf("error no go: %q %v\n", stdin.Text(), stdin.Err())
			os.Exit(1)
		}
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	counter, log, _ := faultKeys(prefix, "job")

	switch mode {
	case "commit", "renew":
		hook := &faultGateHook{gate: func() {}}
		c.AddHook(hook)
		l, err := mutex.New(c, mutex.WithPrefix(prefix), mutex.WithTTL(faultHelperLease))
		if err != nil {
			return err
		}
		var opts []mutex.Option
		if mode == "renew" {
			opts = append(opts, mutex.WithAutoRenew())
		}
		lk, err := l.Lock(ctx, "job", opts...)
		if err != nil {
			return err
		}
		var owned context.Context
		if mode == "renew" {
			owned = lk.Context(ctx)
		}
		v, err := faultGet(ctx, c, counter)
		if err != nil {
			return err
		}
		fmt.Printf("ready %s %d\n", lk.Token(), v)
		waitGo()
		hook.commitNext()
		_, err = lk.UnlockWith(ctx, mutex.Call{Fragment: faultCommit, Keys: []string{counter, log}, Args: []any{v + 1, "helper:" + lk.Token()}})
		cause := "none"
		if owned != nil {
			// Lock.Context hears of the end through context.AfterFunc,
			// in a goroutine of its own: give it a moment.
			faultWithin(owned.Done(), 2*time.Second)
			cause = fmt.Sprint(context.Cause(owned))
		}
		fmt.Printf("result notheld=%v sent=%d err=%q cause=%q\n", errors.Is(err, mutex.ErrNotHeld), hook.sent(), fmt.Sprint(err), cause)
	case "funnel":
		hook := &faultGateHook{gate: func() {
			fmt.Println("ready")
			waitGo()
		}}
		c.AddHook(hook)
		// Uniform cost: the key has no state, and the call must still take
		// the lock and be paused between its read and its commit.
		lim, err := funnel.New(c, funnel.WithPrefix(prefix), funnel.WithLease(faultHelperLease), funnel.WithUniformCost())
		if err != nil {
			return err
		}
		res, err := lim.Allow(ctx, "sms", faultRule)
		if err != nil {
			return err
		}
		fmt.Printf("result allowed=%v sent=%d\n", res.Allowed, hook.sent())
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	return nil
}

// faultHelper is a running helper process.
type faultHelper struct {
	cmd    *exec.Cmd
	stdin  interface{ Write([]byte) (int, error) }
	lines  chan string
	stderr *bytes.Buffer
}

// startFaultHelper re-executes the test binary as a helper in mode against
// the server at addr; the helper is continued and killed, by pid, when t ends.
func startFaultHelper(t *testing.T, mode, addr, prefix string) *faultHelper {
	t.Helper()
	cmd := testutil.HelperCommand(t, "TestHelperProcess", 30*time.Second, helperEnv+"="+mode, helperAddrEnv+"="+addr, helperPrefixEnv+"="+prefix)
	h := &faultHelper{cmd: cmd, lines: make(chan string, 16), stderr: new(bytes.Buffer)}
	cmd.Stderr = h.stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.stdin = in
	var reader sync.WaitGroup
	reader.Go(func() {
		defer close(h.lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			h.lines <- s.Text()
		}
	})
	t.Cleanup(func() {
		pid := cmd.Process.Pid
		_ = syscall.Kill(pid, syscall.SIGCONT)
		_ = cmd.Process.Kill() // by pid; harmless if it has exited
		reader.Wait()
		_ = cmd.Wait()
		in.Close()
	})
	return h
}

// expect returns the helper's next line starting with prefix, failing on
// an "error" line, the helper's exit, or a timeout.
func (h *faultHelper) expect(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case line, ok := <-h.lines:
			if !ok {
				t.Fatalf("helper exited before %q; stderr:\n%s", prefix, h.stderr.String())
			}
			if strings.HasPrefix(line, "error") {
				t.Fatalf("helper: %s", line)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-timeout:
			t.Fatalf("no %q line from the helper in 15 s", prefix)
		}
	}
}

func (h *faultHelper) send(t *testing.T, line string) {
	t.Helper()
	if _, err := h.stdin.Write([]byte(line + "\n")); err != nil {
		t.Fatalf("write to the helper: %v", err)
	}
}

// faultFields parses "k=v" fields (v may be quoted).
func faultFields(t *testing.T, line string) map[string]string {
	t.Helper()
	m := map[string]string{}
	rest := line
	for rest != "" {
		rest = strings.TrimLeft(rest, " ")
		k, after, ok := strings.Cut(rest, "=")
		if !ok {
			break
		}
		var v string
		if strings.HasPrefix(after, `"`) {
			q, err := strconv.QuotedPrefix(after)
			if err != nil {
				t.Fatalf("bad helper line %q: %v", line, err)
			}
			v, _ = strconv.Unquote(q)
			rest = after[len(q):]
		} else {
			v, rest, _ = strings.Cut(after, " ")
		}
		m[k] = v
	}
	return m
}

// TestPausedHolder runs the paused-holder scenario on the lock's own
// commit-while-held write (with and without WithAutoRenew) and on a funnel
// admission, and counts the stale writes that landed: there must be none.
func TestPausedHolder(t *testing.T) {
	testutil.NeedServer(t)
	for _, mode := range []string{"commit", "renew"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			srv, admin := faultServer(t)
			prefix := testutil.NewPrefix()
			counter, log, lockKey := faultKeys(prefix, "job")
			h := startFaultHelper(t, mode, srv.Addr, prefix)
			ready := strings.Fields(h.expect(t, "ready "))
			if len(ready) != 3 {
				t.Fatalf("helper said %q", ready)
			}
			helperToken := ready[1]
			thaw := testutil.Freeze(t, h.cmd.Process.Pid)
			stopped := time.Now()

			// The lease lapses while the helper is stopped (nothing renews it).
			for admin.Exists(ctx, lockKey).Val() != 0 {
				if time.Since(stopped) > 10*time.Second {
					t.Fatalf("the stopped helper's lock did not expire in 10 s")
				}
				time.Sleep(10 * time.Millisecond)
			}
			l := mustLocker(t, admin, mutex.WithPrefix(prefix), mutex.WithTTL(10*time.Second))
			lk, err := l.Lock(ctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			v, err := faultGet(ctx, admin, counter)
			if err != nil {
				t.Fatal(err)
			}
			// The helper commits while this process holds the lock.
			pausedFor := time.Since(stopped)
			thaw()
			h.send(t, "go")
			res := faultFields(t, strings.TrimPrefix(h.expect(t, "result "), "result "))
			if _, err := lk.UnlockWith(ctx, mutex.Call{Fragment: faultCommit, Keys: []string{counter, log}, Args: []any{v + 1, "test:" + lk.Token()}}); err != nil {
				t.Fatalf("the live holder's commit: %v", err)
			}
			writers, err := admin.LRange(ctx, log, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			stale := 0
			for _, w := range writers {
				if w == "helper:"+helperToken {
					stale++
				}
			}
			t.Logf("helper: %v; writers %v", res, writers)
			if res["notheld"] != "true" {
				t.Errorf("the paused helper's commit returned %s, want ErrNotHeld", res["err"])
			}
			if mode == "commit" && res["sent"] == "0" {
				t.Errorf("the paused helper's commit never reached Redis: the server-side refusal was not exercised")
			}
			if mode == "renew" && !strings.Contains(res["cause"], mutex.ErrLockLost.Error()) {
				t.Errorf("the paused helper's Context ended with %q, want ErrLockLost", res["cause"])
			}
			if stale != 0 || len(writers) != 1 {
				t.Errorf("writers %v: want only the live holder's", writers)
			}
			if got := admin.Get(ctx, counter).Val(); got != strconv.FormatInt(v+1, 10) {
				t.Errorf("counter %s, want the live holder's %d", got, v+1)
			}
			fault := fmt.Sprintf("holder process SIGSTOPped %v, lease %v (%s)", pausedFor.Round(10*time.Millisecond), faultHelperLease, mode)
			faultFigure(t, "paused holder: stale commit-while-held writes landed", fault, "%d (commit sent to Redis %s times, refused)", stale, res["sent"])
		})
	}

	t.Run("funnel", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		srv, admin := faultServer(t)
		prefix := testutil.NewPrefix()
		lockKey := keyspace.Key(prefix, "sms", "lock") // what Locker.Key returns
		h := startFaultHelper(t, "funnel", srv.Addr, prefix)
		h.expect(t, "ready")
		thaw := testutil.Freeze(t, h.cmd.Process.Pid)
		stopped := time.Now()
		// The helper has read an empty funnel (room for its unit) and holds
		// the key's lock; its lease lapses while it is stopped.
		for admin.Exists(ctx, lockKey).Val() != 0 {
			if time.Since(stopped) > 10*time.Second {
				t.Fatalf("the stopped helper's funnel lock did not expire in 10 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		lim := mustLimiter(t, admin, funnel.WithPrefix(prefix))
		mine, err := lim.Allow(ctx, "sms", faultRule)
		if err != nil {
			t.Fatal(err)
		}
		if !mine.Allowed {
			t.Fatalf("the live caller was denied on a funnel nobody had written: %+v", mine)
		}
		pausedFor := time.Since(stopped)
		thaw()
		h.send(t, "go")
		res := faultFields(t, strings.TrimPrefix(h.expect(t, "result "), "result "))
		peek, err := lim.Peek(ctx, "sms", faultRule)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("helper: %v; live caller %+v; peek %+v", res, mine, peek)
		admitted := 1
		if res["allowed"] == "true" {
			admitted++
		}
		if admitted > int(faultRule.Capacity) {
			t.Errorf("%d admissions with capacity %d: the paused caller's stale commit landed", admitted, faultRule.Capacity)
		}
		if n, _ := strconv.Atoi(res["sent"]); n < 2 {
			t.Errorf("the paused caller made %s script calls after it continued, want its refused commit and a re-read (>= 2)", res["sent"])
		}
		fault := fmt.Sprintf("funnel caller process SIGSTOPped %v between read and commit, lease %v", pausedFor.Round(10*time.Millisecond), faultHelperLease)
		faultFigure(t, "paused holder: stale funnel commits landed", fault, "%d (capacity %d, admitted %d)", admitted-1, faultRule.Capacity, admitted)
	})
}
