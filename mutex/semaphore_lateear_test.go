package mutex_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// semHoldReply is a go-redis hook that holds back the reply of the first
// semaphore_acquire.lua call asking for lease (a lease no other call asks
// for): it closes got when that reply came, and hands it to the caller
// only once release is closed.
type semHoldReply struct {
	lease   int64
	once    sync.Once
	got     chan struct{}
	release chan struct{}
}

func (h *semHoldReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *semHoldReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.hold([]redis.Cmder{cmd})
		return err
	}
}

func (h *semHoldReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.hold(cmds)
		return err
	}
}

func (h *semHoldReply) hold(cmds []redis.Cmder) {
	for _, cmd := range cmds {
		if argv := testutil.ScriptArgs(cmd); len(argv) == 7 && argv[3] == h.lease {
			first := false
			h.once.Do(func() { first = true })
			if first {
				close(h.got)
				<-h.release
			}
			return
		}
	}
}

// TestSemaphoreGrantBeforeListening: a waiter is granted between its first
// poll (which queued it) and the moment it listens for grants, while
// other waiters of its Locker already listen on the channel: it must not
// sleep until its next poll (10 s or more here) but poll once more at once and
// find the grant. Its context of 5 s fails it otherwise.
func TestSemaphoreGrantBeforeListening(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	hook := &semHoldReply{lease: (time.Minute + 7*time.Millisecond).Milliseconds(), got: make(chan struct{}), release: make(chan struct{})}
	c := b.Client(t)
	var rec testutil.CommandRecorder
	c.AddHook(&rec)
	c.AddHook(hook)
	slow := mutex.WithRetryInterval(10 * time.Second) // polls every 10 to 20 s (a lease of a minute)
	ws := mustSem(t, mustNew(t, c, mutex.WithPrefix(b.Prefix), slow), "late", 2)
	hs := mustSem(t, newLocker(t, b), "late", 2)
	holder, err := hs.TryAcquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() {
		p, err := ws.Acquire(ctx, 1, mutex.WithTTL(time.Minute))
		if err == nil {
			err = p.Release(ctx)
		}
		first <- err
	}()
	waitSemQueued(t, b, ws, 1)
	// Its first poll queued it; it subscribed and polled again: it listens.
	for deadline := time.Now().Add(10 * time.Second); semScripts(rec.Commands()) < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the first waiter made %d polls, want 2", semScripts(rec.Commands()))
		}
	}
	late := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		p, err := ws.Acquire(wctx, 1, mutex.WithTTL(time.Minute+7*time.Millisecond))
		if err == nil {
			err = p.Release(ctx)
		}
		late <- err
	}()
	<-hook.got // the second waiter is queued, and does not listen yet
	// A third waiter, for 2 permits, queues behind it and listens: the
	// channel stays subscribed when the first waiter leaves.
	third := make(chan error, 1)
	go func() {
		p, err := ws.Acquire(ctx, 2, mutex.WithTTL(time.Minute))
		if err == nil {
			err = p.Release(ctx)
		}
		third <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); semScripts(rec.Commands()) < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the third waiter did not poll")
		}
	}
	if err := holder.Release(ctx); err != nil { // grants the first two
		t.Fatal(err)
	}
	// The first waiter heard the grants' message: the second missed it.
	if err := <-first; err != nil {
		t.Fatalf("the first waiter: %v", err)
	}
	close(hook.release)
	if err := <-late; err != nil {
		t.Fatalf("the waiter granted before it listened: %v (it slept to its next poll)", err)
	}
	if err := <-third; err != nil {
		t.Fatalf("the third waiter: %v", err)
	}
}
