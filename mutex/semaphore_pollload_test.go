package mutex_test

import (
	"context"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// TestSemaphoreWaiterPollLoad measures what keeping their places costs:
// 8 waiters (DefaultRetryInterval) queued behind a holder for 2 s, on a
// server of the test's own; it logs their polls per waiter and second and
// the server's time in them, and how often a live waiter was out of the
// queue for polling late (it queues again at its place), and fails if a waiter polls more often than
// once a retry interval (the pause between two polls is at least one).
func TestSemaphoreWaiterPollLoad(t *testing.T) {
	const waiters, window = 8, 2 * time.Second
	srv := testutil.StartServer(t)
	rc := srv.Client(t)
	ctx := context.Background()
	var rec testutil.CommandRecorder
	wc := srv.Client(t)
	wc.AddHook(&rec)
	prefix := testutil.NewPrefix()
	hs := mustSem(t, mustNew(t, srv.Client(t), mutex.WithPrefix(prefix)), "load", 1)
	ws := mustSem(t, mustNew(t, wc, mutex.WithPrefix(prefix)), "load", 1)
	holder, err := hs.TryAcquire(ctx, 1, mutex.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, waiters)
	for range waiters {
		go func() {
			_, err := ws.Acquire(wctx, 1, mutex.WithTTL(time.Minute))
			done <- err
		}()
	}
	waitQueue(t, rc, mutex.SemKey(ws, "sem:queue"), waiters)
	time.Sleep(200 * time.Millisecond) // subscribed, past the second poll
	if err := rc.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	rec.Reset()
	start := time.Now()
	// Sample the queue meanwhile: a live waiter whose poll came late is
	// out of it until its next poll.
	samples, out := 0, 0
	for time.Since(start) < window {
		if n, err := rc.ZCard(ctx, mutex.SemKey(ws, "sem:queue")).Result(); err == nil {
			samples++
			if n < waiters {
				out++
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	polls, elapsed := semScripts(rec.Commands()), time.Since(start)
	calls, usec := redisWork(t, rc)
	calls -= int64(samples) // the ZCARDs above
	cancel()
	for range waiters {
		<-done
	}
	_ = holder.Release(ctx)
	perSec := float64(polls) / waiters / elapsed.Seconds()
	t.Logf("%d waiters, %v: %d polls, %.1f per waiter and second; %.1f commands and %.1f µs of script time per poll, %.2f ms of script time per waiter and second; a waiter out of the queue (polled late) in %d of %d samples",
		waiters, elapsed.Round(time.Millisecond), polls, perSec, float64(calls)/float64(max(polls, 1)),
		float64(usec)/float64(max(polls, 1)), float64(usec)/1000/waiters/elapsed.Seconds(), out, samples)
	if most := waiters * (int(elapsed/mutex.DefaultRetryInterval) + 1); polls > most {
		t.Errorf("%d polls in %v by %d waiters, want at most %d: one per retry interval", polls, elapsed, waiters, most)
	}
}
