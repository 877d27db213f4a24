package mutex_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// stallPolls is a go-redis hook that, once armed, holds a waiter's polls
// (the acquire script in a waiting mode) until it is let go: a waiter
// whose process is paused, or whose network is slow, for as long as the
// test likes.
type stallPolls struct {
	mu   sync.Mutex
	gate chan struct{} // nil while not armed
	held chan struct{} // closed when a poll is held
	once sync.Once
	// reply gets the first element of the reply to the first poll held (1:
	// granted, 0: queued).
	reply chan int64
}

func newStallPolls() *stallPolls {
	return &stallPolls{held: make(chan struct{}), reply: make(chan int64, 1)}
}

// arm holds every poll from now on; the returned function lets them go.
func (h *stallPolls) arm() (letGo func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	gate := make(chan struct{})
	h.gate = gate
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			h.gate = nil
			h.mu.Unlock()
			close(gate)
		})
	}
}

// hold holds the poll among cmds while armed, and returns it.
func (h *stallPolls) hold(cmds []redis.Cmder) *redis.Cmd {
	h.mu.Lock()
	gate := h.gate
	h.mu.Unlock()
	if gate == nil {
		return nil
	}
	for _, c := range cmds {
		if argv := testutil.ScriptArgs(c); len(argv) == 7 { // semaphore_acquire.lua: ARGV[5] is the mode
			if mode, _ := argv[4].(string); strings.HasPrefix(mode, "w") {
				h.once.Do(func() { close(h.held) })
				<-gate
				cmd, _ := c.(*redis.Cmd)
				return cmd
			}
		}
	}
	return nil
}

// replied reports the reply of a poll that was held.
func (h *stallPolls) replied(poll *redis.Cmd) {
	if poll == nil {
		return
	}
	r, err := poll.Int64Slice()
	if err != nil || len(r) == 0 {
		r = []int64{-100}
	}
	select {
	case h.reply <- r[0]:
	default:
	}
}

func (h *stallPolls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *stallPolls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		poll := h.hold([]redis.Cmder{cmd})
		err := next(ctx, cmd)
		h.replied(poll)
		return err
	}
}

func (h *stallPolls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		poll := h.hold(cmds)
		err := next(ctx, cmds)
		h.replied(poll)
		return err
	}
}

// TestSemaphoreLateWaiterKeepsPlace: the head waiter A's polls are held
// (a pause) until the waiter B behind it has passed it over (its wait
// lease ended); let go, A's next poll queues it again at the place it had,
// ahead of B, and the next release grants A, not B. Queued again at the
// tail, as a new waiter, A would wait behind B: the test fails so.
func TestSemaphoreLateWaiterKeepsPlace(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	rc := b.Client(t)
	stall := newStallPolls()
	ca := b.Client(t)
	ca.AddHook(stall)
	sa := mustSem(t, mustNew(t, ca, mutex.WithPrefix(b.Prefix)), "late", 1)
	sb := mustSem(t, newLocker(t, b), "late", 1)
	holder, err := sb.TryAcquire(ctx, 1, mutex.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	queue := mutex.SemKey(sa, "sem:queue")
	wait := func(s *mutex.Semaphore) <-chan *mutex.Permit {
		got := make(chan *mutex.Permit, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			p, err := s.Acquire(wctx, 1, mutex.WithTTL(time.Minute))
			if err != nil {
				t.Error(err)
			}
			got <- p
		}()
		return got
	}
	aGot := wait(sa)
	a := waitQueue(t, rc, queue, 1)[0]
	bGot := wait(sb)
	order := waitQueue(t, rc, queue, 2)
	letGo := stall.arm()
	defer letGo()
	<-stall.held
	for deadline := time.Now().Add(10 * time.Second); slices.Contains(order, a); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("A, its polls held for 10 s, is still queued: %v", order)
		}
		order, _ = rc.ZRange(ctx, queue, 0, -1).Result()
	}
	letGo()
	for deadline := time.Now().Add(10 * time.Second); len(order) != 2; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("A did not queue again: %v", order)
		}
		order, _ = rc.ZRange(ctx, queue, 0, -1).Result()
	}
	if order[0] != a {
		t.Errorf("A queued again behind B: %v, want A first", order)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-aGot:
		if p != nil {
			_ = p.Release(ctx)
		}
	case p := <-bGot:
		t.Errorf("the release granted B, queued behind the late A")
		if p != nil {
			_ = p.Release(ctx)
		}
		<-aGot
		return
	}
	if p := <-bGot; p != nil {
		_ = p.Release(ctx)
	}
}

// TestSemaphoreLateWaiterGrantedAtItsPlace: the head waiter A (1 of 2
// permits) polls late and is passed over; a release frees 1 permit while
// it is out, which the next waiter B (2 permits) does not fit; A's late
// poll queues it again ahead of B, where the permit fits it, and grants it
// in that poll, as a release would have had A not been out. Queued again
// without its permits (until another call's script pumps the queue), or
// behind B, the test fails.
func TestSemaphoreLateWaiterGrantedAtItsPlace(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	rc := b.Client(t)
	stall := newStallPolls()
	ca := b.Client(t)
	ca.AddHook(stall)
	sa := mustSem(t, mustNew(t, ca, mutex.WithPrefix(b.Prefix)), "head", 2)
	sb := mustSem(t, newLocker(t, b), "head", 2)
	var holders []*mutex.Permit
	for range 2 {
		p, err := sb.TryAcquire(ctx, 1, mutex.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, p)
	}
	queue := mutex.SemKey(sa, "sem:queue")
	acquire := func(s *mutex.Semaphore, n int64) <-chan *mutex.Permit {
		got := make(chan *mutex.Permit, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			p, err := s.Acquire(wctx, n, mutex.WithTTL(time.Minute))
			if err != nil {
				t.Error(err)
			}
			got <- p
		}()
		return got
	}
	aGot := acquire(sa, 1)
	a := waitQueue(t, rc, queue, 1)[0]
	bGot := acquire(sb, 2)
	order := waitQueue(t, rc, queue, 2)
	letGo := stall.arm()
	defer letGo()
	<-stall.held
	for deadline := time.Now().Add(10 * time.Second); slices.Contains(order, a); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("A, its polls held for 10 s, is still queued: %v", order)
		}
		order, _ = rc.ZRange(ctx, queue, 0, -1).Result()
	}
	if err := holders[0].Release(ctx); err != nil { // 1 free: B does not fit
		t.Fatal(err)
	}
	letGo()
	if r := <-stall.reply; r != 1 {
		t.Errorf("A's late poll answered %d, want 1: granted at its place", r)
	}
	if p := <-aGot; p != nil {
		_ = p.Release(ctx)
	}
	_ = holders[1].Release(ctx)
	if p := <-bGot; p != nil {
		_ = p.Release(ctx)
	}
}
