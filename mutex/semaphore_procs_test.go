package mutex_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// The multi-process counting test: helper processes (this test binary,
// re-executed) take and release random weights of one semaphore from 8
// goroutines each and report every grant and release, with times on the
// machine's wall clock, which all processes share: "g <id> <n> <received>
// <lost signal due>" and "r <id> <release sent>" (ns). The test stops one
// helper with SIGSTOP for three leases and kills another with SIGKILL. A
// hold counts from when its grant was received until its release was sent
// or its lost signal was due (Permit.Done's deadline), whichever is first:
// a stopped or killed holder's hold ends at that deadline (and one
// received after it, by a waiter stopped meanwhile, does not count). At
// every grant
// the holds counted, the new one included, must not exceed the size. Each
// helper loses the reply of a semaphore script every 20 ms (go-redis runs
// it again).

const (
	semHelperEnv = "FUNNELGUARD_SEM_HELPER" // addr,prefix,hold: run as a helper
	semProcSize  = 4
	semProcLease = 300 * time.Millisecond
	semProcRun   = 4 * time.Second
)

// TestSemaphoreHelperProcess is a helper when semHelperEnv is set;
// otherwise it does nothing. It exits the process itself.
func TestSemaphoreHelperProcess(t *testing.T) {
	spec := os.Getenv(semHelperEnv)
	if spec == "" {
		return
	}
	parts := strings.Split(spec, ",")
	hold, _ := time.ParseDuration(parts[2])
	if err := runSemHelper(t, parts[0], parts[1], hold); err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	fmt.Println("done")
	os.Exit(0)
}

func runSemHelper(t *testing.T, addr, prefix string, hold time.Duration) error {
	f := testutil.NewLostReply(t)
	o := f.Options(addr)
	o.ContextTimeoutEnabled = true
	c := redis.NewClient(o)
	defer c.Close()
	l, err := mutex.New(c, mutex.WithPrefix(prefix), mutex.WithRetryInterval(20*time.Millisecond))
	if err != nil {
		return err
	}
	s, err := l.Semaphore("procs", semProcSize)
	if err != nil {
		return err
	}
	var out sync.Mutex
	var seq int
	say := func(format string, a ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", a...) // unbuffered: a line is out before the call that follows it
	}
	stop := time.Now().Add(semProcRun)
	var wg sync.WaitGroup
	wg.Go(func() { // a lost reply of a semaphore script every 20 ms, while it runs
		scripts := testutil.Scripts(mutex.SemKey(s, "sem:ends"))
		for time.Now().Before(stop) {
			f.Drop(scripts)
			time.Sleep(20 * time.Millisecond)
		}
		f.Disarm()
		say("lost %d", f.Dropped())
	})
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				n := 1 + rand.Int64N(semProcSize)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				p, err := s.Acquire(ctx, n, mutex.WithTTL(semProcLease))
				cancel()
				if errors.Is(err, mutex.ErrNotObtained) {
					continue
				}
				if err != nil {
					say("failed %v", err) // a lost reply whose retries were lost too
					continue
				}
				recv := time.Now()
				out.Lock()
				seq++
				id := seq
				out.Unlock()
				say("g %d %d %d %d", id, n, recv.UnixNano(), mutex.PermitDeadline(p).UnixNano())
				time.Sleep(hold + time.Duration(rand.IntN(10))*time.Millisecond)
				say("r %d %d", id, time.Now().UnixNano())
				_ = p.Release(context.Background()) // ErrNotHeld after a stop: the lease ended
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

type semHold struct {
	proc, id   int
	n          int64
	recv, ends int64
}

// startSemHelper starts helper number proc, whose holds last hold and up
// to 10 ms more; its lines go to lines, tagged.
func startSemHelper(t *testing.T, addr, prefix string, proc int, hold time.Duration, lines chan<- string, readers *sync.WaitGroup) *exec.Cmd {
	t.Helper()
	cmd := testutil.HelperCommand(t, "TestSemaphoreHelperProcess", time.Minute, semHelperEnv+"="+addr+","+prefix+","+hold.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	readers.Go(func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- strconv.Itoa(proc) + " " + s.Text()
		}
	})
	return cmd
}

func TestSemaphoreProcesses(t *testing.T) {
	testutil.NeedServer(t)
	srv := testutil.Real(t)
	prefix := testutil.NewPrefix()
	lines := make(chan string, 1024)
	var readers sync.WaitGroup
	var cmds []*exec.Cmd
	// Helpers 0 and 1 hold 50 ms, so that a stop or kill made as one of
	// their grants is seen catches them holding.
	for p, hold := range []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 0} {
		cmds = append(cmds, startSemHelper(t, srv.Addr, prefix, p, hold, lines, &readers))
	}
	var collected []string
	collect := make(chan struct{})
	var mu sync.Mutex
	granted := map[int]chan struct{}{} // a grant of helper p is seen: closed once
	onGrant := func(p int) <-chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		granted[p] = make(chan struct{})
		return granted[p]
	}
	go func() {
		defer close(collect)
		for l := range lines {
			collected = append(collected, l)
			mu.Lock()
			if p, _ := strconv.Atoi(l[:1]); strings.HasPrefix(l[1:], " g ") && granted[p] != nil {
				close(granted[p])
				granted[p] = nil
			}
			mu.Unlock()
		}
	}()
	seen := func(p int) {
		select {
		case <-onGrant(p):
		case <-time.After(10 * time.Second):
			t.Fatalf("no grant of helper %d in 10 s", p)
		}
	}
	time.Sleep(semProcRun / 4)
	seen(0)
	stopped := cmds[0].Process.Pid
	if err := syscall.Kill(stopped, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * semProcLease)
	_ = syscall.Kill(stopped, syscall.SIGCONT)
	time.Sleep(semProcRun / 4)
	seen(1)
	_ = cmds[1].Process.Kill()
	// Every line read before Wait: Wait closes the pipe once the helper
	// exits, and a line not yet read then is lost (a loaded machine lost a
	// helper's "done" so).
	readers.Wait()
	for _, c := range cmds {
		_ = c.Wait()
	}
	close(lines)
	<-collect
	checkSemHolds(t, collected)
}

// semReport is what the helpers' lines say.
type semReport struct {
	holds                 []*semHold
	abandoned             int // grants of the killed helper (1) not released
	stopped               int // grants of the stopped helper (0) released after their lost signal
	done, dropped, failed int
	unknown               []string
}

// parseSemLines reads the helpers' lines: a hold ends at its release, if
// it was sent before its lost signal was due.
func parseSemLines(lines []string) semReport {
	var r semReport
	holds, released := map[[2]int]*semHold{}, map[[2]int]bool{}
	for _, line := range lines {
		f := strings.Fields(line)
		proc, _ := strconv.Atoi(f[0])
		switch {
		case len(f) == 6 && f[1] == "g":
			h := semHold{proc: proc}
			h.id, _ = strconv.Atoi(f[2])
			h.n, _ = strconv.ParseInt(f[3], 10, 64)
			h.recv, _ = strconv.ParseInt(f[4], 10, 64)
			h.ends, _ = strconv.ParseInt(f[5], 10, 64)
			holds[[2]int{proc, h.id}] = &h
		case len(f) == 4 && f[1] == "r":
			id, _ := strconv.Atoi(f[2])
			sent, _ := strconv.ParseInt(f[3], 10, 64)
			released[[2]int{proc, id}] = true
			switch h := holds[[2]int{proc, id}]; {
			case h == nil:
			case sent < h.ends:
				h.ends = sent
			case proc == 0:
				r.stopped++
			}
		case len(f) == 2 && f[1] == "done":
			r.done++
		case f[1] == "failed":
			r.failed++
		case len(f) == 3 && f[1] == "lost":
			lost, _ := strconv.Atoi(f[2])
			r.dropped += lost
		default:
			r.unknown = append(r.unknown, line)
		}
	}
	for k, h := range holds {
		r.holds = append(r.holds, h)
		if h.proc == 1 && !released[k] {
			r.abandoned++
		}
	}
	sort.Slice(r.holds, func(i, j int) bool { return r.holds[i].recv < r.holds[j].recv })
	return r
}

// checkSemHolds checks the holds the helpers reported.
func checkSemHolds(t *testing.T, lines []string) {
	t.Helper()
	r := parseSemLines(lines)
	for _, l := range r.unknown {
		t.Errorf("helper %s", l)
	}
	violations, worst, late := 0, int64(0), 0
	for i, g := range r.holds {
		if g.ends <= g.recv { // lost before it was received (a stopped waiter): Done closed at once
			late++
			continue
		}
		sum := g.n
		for _, h := range r.holds[:i] {
			if h.ends > g.recv {
				sum += h.n
			}
		}
		worst = max(worst, sum)
		if sum > semProcSize {
			violations++
		}
	}
	t.Logf("%d grants from 3 processes (one stopped for %v holding %d grants, one killed holding %d grants, %d replies lost, %d Acquires failed, %d grants lost on arrival), at most %d of %d permits held at once, %d violations",
		len(r.holds), 3*semProcLease, r.stopped, r.abandoned, r.dropped, r.failed, late, worst, semProcSize, violations)
	if violations > 0 {
		t.Errorf("%d grants found more than %d permits held", violations, semProcSize)
	}
	if r.abandoned == 0 || r.stopped == 0 || r.done != 2 || len(r.holds) < 30 || r.dropped < 20 {
		t.Errorf("the killed helper held %d grants, the stopped one %d (want some of each), %d helpers finished (want 2), %d grants (want at least 30), %d replies lost (want 20): the test checked too little",
			r.abandoned, r.stopped, r.done, len(r.holds), r.dropped)
	}
}
