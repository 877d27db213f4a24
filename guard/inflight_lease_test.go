package guard_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// killSlots is the InFlight of the killed-process test.
const killSlots = 3

// inflightHelperEnv makes the test binary a helper process: "<addr>,<prefix>".
// It runs killSlots calls of the key "k" on a guard of default lease
// whose fns never return, and one more call that waits for a permit, until
// it is killed.
const inflightHelperEnv = "FUNNELGUARD_INFLIGHT_HELPER"

// TestInFlightHelperProcess is the helper when inflightHelperEnv is set;
// otherwise it does nothing. It exits the process itself.
func TestInFlightHelperProcess(t *testing.T) {
	spec := os.Getenv(inflightHelperEnv)
	if spec == "" {
		return
	}
	addr, prefix, _ := strings.Cut(spec, ",")
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	g, err := guard.New(c, guard.WithPrefix(prefix), guard.WithRules(plenty...), guard.WithInFlight(killSlots), guard.WithTimeout(time.Minute))
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	for range killSlots + 1 {
		go func() {
			_, err := g.Do(context.Background(), "k", func(context.Context) error {
				fmt.Println("running")
				time.Sleep(time.Hour) // until killed
				return nil
			})
			fmt.Printf("returned %v\n", err) // only if not killed first
		}()
	}
	time.Sleep(time.Minute)
	os.Exit(1)
}

// startInFlightHelper starts the helper on addr under prefix and returns
// once its killSlots calls run.
func startInFlightHelper(t *testing.T, addr, prefix string) *exec.Cmd {
	t.Helper()
	cmd := testutil.HelperCommand(t, "TestInFlightHelperProcess", 90*time.Second, inflightHelperEnv+"="+addr+","+prefix)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 8)
	go func() {
		defer close(lines)
		for s := bufio.NewScanner(out); s.Scan(); {
			lines <- s.Text()
		}
	}()
	timeout := time.After(30 * time.Second)
	for running := 0; running < killSlots; {
		select {
		case l, ok := <-lines:
			if !ok || l != "running" {
				t.Fatalf("helper said %q (ended: %v) with %d calls running", l, !ok, running)
			}
			running++
		case <-timeout:
			t.Fatalf("%d of the helper's %d calls run after 30 s", running, killSlots)
		}
	}
	return cmd
}

// semKey is the key of kind of the InFlight semaphore of the plain key key
// under the guard prefix prefix (as semQueueKey).
func semKey(prefix, key, kind string) string {
	return prefix + "{k:" + key + "}:" + kind
}

// TestInFlightKilledProcessFreesSlots: a process running InFlight (3)
// calls of a key on a guard of the default InFlightLease, and one more
// call waiting for a permit, is killed (SIGKILL) after its calls renewed
// their permits; another process's 3 calls of the key, waiting in the
// queue, all run within DefaultInFlightLease + 3 retry intervals (the
// documented bound) + a margin of 2 s for a loaded machine. With the
// permits on the Locker's TTL (10 s) they ran 8.5 s after the kill: the
// test fails so.
func TestInFlightKilledProcessFreesSlots(t *testing.T) {
	testutil.NeedServer(t)
	srv := testutil.Real(t)
	prefix := testutil.NewPrefix()
	ctx := context.Background()
	rc := srv.Client(t)
	helper := startInFlightHelper(t, srv.Addr, prefix)
	waitQueued(t, rc, semKey(prefix, "k", "sem:queue"), 1, &atomic.Int64{}, 0)
	time.Sleep(guard.DefaultInFlightLease / 2) // past the first renewal, at a third
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	killed := time.Now()
	// The semaphore's ends set scores holders and waiters below 2^52 (records
	// above); less the queued waiters, the holders.
	live, err := rc.ZCount(ctx, semKey(prefix, "k", "sem:ends"), "-inf", "(4503599627370496").Result()
	if n := live - rc.ZCard(ctx, semKey(prefix, "k", "sem:queue")).Val(); err != nil || n != killSlots {
		t.Fatalf("%d holders after the kill (%v), want the dead process's %d", n, err, killSlots)
	}
	g, err := guard.New(srv.Client(t), guard.WithPrefix(prefix), guard.WithRules(plenty...), guard.WithInFlight(killSlots), guard.WithTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	in, release := make(chan struct{}, killSlots), make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release)
	for range killSlots {
		wg.Go(func() {
			_, err := g.Do(ctx, "k", func(context.Context) error {
				in <- struct{}{}
				<-release
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	bound := guard.DefaultInFlightLease + 3*mutex.DefaultRetryInterval + 2*time.Second
	timeout := time.After(30 * time.Second)
	for got := 0; got < killSlots; got++ {
		select {
		case <-in:
		case <-timeout:
			t.Fatalf("%d of %d slots back 30 s after the kill", got, killSlots)
		}
	}
	took := time.Since(killed)
	t.Logf("all %d slots back %v after the kill", killSlots, took.Round(time.Millisecond))
	if took > bound {
		t.Errorf("the killed process's %d slots came back %v after the kill, want within %v", killSlots, took, bound)
	}
}

// TestInFlightLongCallRenewed: two calls of a key (InFlight 2, on two
// guards with their own Lockers) run 3.5 times their InFlightLease of 1 s
// while four callers keep trying the key: the calls keep their permits
// (renewed: their context is never cancelled) and no other call of the
// key runs meanwhile (they run to their end even if it is: unrenewed, the
// test fails on both counts).
func TestInFlightLongCallRenewed(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	const lease = time.Second
	long := []guard.Option{guard.WithInFlight(2), guard.WithInFlightLease(lease), guard.WithRules(plenty...)}
	busy := []guard.Option{guard.WithInFlight(2), guard.WithRules(plenty...), guard.WithTimeout(100 * time.Millisecond)}
	var running, most atomic.Int64
	errs := make(chan error, 2)
	started := make(chan struct{}, 2)
	for range 2 {
		g := newGuard(t, b, long...)
		go func() {
			_, err := g.Do(ctx, "k", func(fctx context.Context) error {
				raise(&most, running.Add(1))
				defer running.Add(-1)
				start, end := time.Now(), time.After(3*lease+lease/2)
				started <- struct{}{}
				select {
				case <-end:
					return nil
				case <-fctx.Done():
					err := fmt.Errorf("its context ended after %v: %w", time.Since(start), context.Cause(fctx))
					<-end // it runs on, as a call that does not watch its context would
					return err
				}
			})
			errs <- err
		}()
	}
	for range 2 {
		<-started
	}
	stop := make(chan struct{})
	var others, refused atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		g := newGuard(t, b, busy...)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := g.Do(ctx, "k", func(context.Context) error {
					raise(&most, running.Add(1))
					running.Add(-1)
					others.Add(1)
					return nil
				})
				if errors.Is(err, guard.ErrBusy) {
					refused.Add(1)
				}
			}
		})
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a call 3.5 times as long as its lease: %v", err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("the other callers: %d calls refused busy, %d ran (after the long calls)", refused.Load(), others.Load())
	if m := most.Load(); m != 2 {
		t.Errorf("at most %d calls of the key ran at once, want 2", m)
	}
	if refused.Load() == 0 {
		t.Error("no call was refused: the test checked nothing")
	}
}

// TestInFlightLeasePolicy: InFlightLease under MinInFlightLease, negative
// or over mutex.MaxTTL is ErrInvalidOption; MinInFlightLease, MaxTTL and
// zero (the default) are accepted.
func TestInFlightLeasePolicy(t *testing.T) {
	b := testutil.Mini(t)
	for _, d := range []time.Duration{-time.Second, -1, 1, guard.MinInFlightLease - 1, mutex.MaxTTL + 1, math.MaxInt64} {
		if _, err := guard.New(b.Client(t), guard.WithRules(plenty...), guard.WithInFlight(1), guard.WithInFlightLease(d)); !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("InFlightLease %v: %v, want ErrInvalidOption", d, err)
		}
	}
	for _, d := range []time.Duration{0, guard.MinInFlightLease, mutex.MaxTTL} {
		g := newGuard(t, b, guard.WithRules(plenty...), guard.WithInFlight(1), guard.WithInFlightLease(d))
		if _, err := g.Do(context.Background(), "k", func(context.Context) error { return nil }); err != nil {
			t.Errorf("InFlightLease %v: Do = %v", d, err)
		}
	}
}
