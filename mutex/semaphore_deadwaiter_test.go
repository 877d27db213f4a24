package mutex_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// semWaiterEnv makes the test binary a helper that waits in the queue of
// the semaphore "dead" (size 1) under a prefix, until it is killed:
// "<addr>,<prefix>".
const semWaiterEnv = "FUNNELGUARD_SEM_WAITER"

// TestSemaphoreWaiterHelperProcess is the waiting helper when semWaiterEnv
// is set; otherwise it does nothing. It exits the process itself.
func TestSemaphoreWaiterHelperProcess(t *testing.T) {
	spec := os.Getenv(semWaiterEnv)
	if spec == "" {
		return
	}
	addr, prefix, _ := strings.Cut(spec, ",")
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	l, err := mutex.New(c, mutex.WithPrefix(prefix)) // DefaultRetryInterval
	if err == nil {
		var s *mutex.Semaphore
		if s, err = l.Semaphore("dead", 1); err == nil {
			fmt.Println("waiting")
			_, err = s.Acquire(context.Background(), 1, mutex.WithTTL(time.Minute))
		}
	}
	fmt.Printf("returned %v\n", err) // only if it is not killed first
	os.Exit(1)
}

// startSemWaiter starts the waiting helper on addr under prefix and returns
// once it has printed that it waits.
func startSemWaiter(t *testing.T, addr, prefix string) *exec.Cmd {
	t.Helper()
	cmd := testutil.HelperCommand(t, "TestSemaphoreWaiterHelperProcess", time.Minute, semWaiterEnv+"="+addr+","+prefix)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "waiting\n" {
		t.Fatalf("helper said %q, %v", line, err)
	}
	return cmd
}

// serverMS is the server's clock (TIME) in ms.
func serverMS(t *testing.T, rc *redis.Client) int64 {
	t.Helper()
	now, err := rc.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// TestSemaphoreKilledWaiterPassedOver: a process queued first for a
// semaphore's one permit is killed (SIGKILL, at a random point of its
// polling); a live waiter queued behind it must get the permit that a
// release frees once the documented bound has passed on the server's
// clock: the dead waiter is passed over at most 3 retry intervals (its
// wait lease) after its last poll, which came before the kill. The dead
// waiter must hold nothing (granted, it would hold the permit for its
// lease of a minute). A wait lease of 20 retry intervals (1 s) fails it.
func TestSemaphoreKilledWaiterPassedOver(t *testing.T) {
	testutil.NeedServer(t)
	srv := testutil.Real(t)
	prefix := testutil.NewPrefix()
	ctx := context.Background()
	rc := srv.Client(t)
	s := mustSem(t, mustNew(t, srv.Client(t), mutex.WithPrefix(prefix)), "dead", 1)
	holder, err := s.TryAcquire(ctx, 1, mutex.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	helper := startSemWaiter(t, srv.Addr, prefix)
	queue := mutex.SemKey(s, "sem:queue")
	dead := waitQueue(t, rc, queue, 1)[0]
	live := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		p, err := s.Acquire(wctx, 1, mutex.WithTTL(time.Minute))
		if err == nil {
			err = p.Release(ctx)
		}
		live <- err
	}()
	waitQueue(t, rc, queue, 2)
	time.Sleep(rand.N(2 * mutex.DefaultRetryInterval)) // anywhere in its poll cycle
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	killed := serverMS(t, rc)
	if end, err := rc.ZScore(ctx, mutex.SemKey(s, "sem:ends"), dead).Result(); err == nil {
		t.Logf("the dead waiter's place lasts %d ms after the kill (server clock)", int64(end)-killed)
	}
	// The bound, plus a margin for a poll sent before the kill and run by
	// the server after the TIME above.
	bound := 3*mutex.DefaultRetryInterval + 100*time.Millisecond
	for serverMS(t, rc) < killed+bound.Milliseconds() {
		time.Sleep(10 * time.Millisecond)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if end, held := semHolds(t, rc, s, dead); held {
		t.Fatalf("the waiter killed %v before the release was granted the permit (held until %d, %d ms after the kill)", bound, int64(end), int64(end)-killed)
	}
	if err := <-live; err != nil {
		t.Fatalf("the live waiter behind the killed one: %v", err)
	}
}

// waitQueue waits until the queue at key holds n waiters and returns them
// in order.
func waitQueue(t *testing.T, rc *redis.Client, key string, n int) []string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		q, err := rc.ZRange(context.Background(), key, 0, -1).Result()
		if err == nil && len(q) == n {
			return q
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue holds %v (%v), want %d waiters", q, err, n)
		}
	}
}
