package mutex_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// recordedClient returns a client of b with a recorder of the commands
// that reached Redis.
func recordedClient(t *testing.T, b *testutil.Backend, o *redis.Options) (*redis.Client, *testutil.CommandRecorder) {
	c := b.ClientOpts(t, o)
	rec := &testutil.CommandRecorder{}
	c.AddHook(rec)
	return c, rec
}

// waitQueued waits until n commands of l queue for a pipeline.
func waitQueued(t *testing.T, l *mutex.Locker, n int) {
	t.Helper()
	waitFor(t, strconv.Itoa(n)+" commands queued", func() bool { return mutex.BatchQueued(l) == n })
}

// Calls that overlap share round trips: with every slot taken by a call
// held at the gate, the next calls queue, and go as one pipeline once the
// gate opens; each gets its own lock, and unlocks it.
func TestBatchedCallsShareARoundTrip(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		for _, honours := range []bool{false, true} {
			t.Run("ContextTimeoutEnabled="+strconv.FormatBool(honours), func(t *testing.T) {
				c, rec := recordedClient(t, b, &redis.Options{ContextTimeoutEnabled: honours})
				l := mustNew(t, c, mutex.WithPrefix(b.Prefix))
				ctx := context.Background()
				warm, err := l.Lock(ctx, "warm") // a script has run: Lock's first try is SET NX
				if err != nil {
					t.Fatal(err)
				}
				if err := warm.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				hold, shut := testutil.HoldHook()
				c.AddHook(hold)
				defer shut()
				slots, queued := mutex.BatchSlots, 10
				var wg sync.WaitGroup
				errs := make(chan error, slots+queued)
				lockUnlock := func(name string) {
					lk, err := l.Lock(ctx, name)
					if err == nil {
						err = lk.Unlock(ctx)
					}
					errs <- err
				}
				for i := range slots {
					wg.Go(func() { lockUnlock("alone" + strconv.Itoa(i)) })
				}
				waitFor(t, "every slot taken", func() bool { return mutex.BatchBusy(l) == slots })
				for i := range queued {
					wg.Go(func() { lockUnlock("queued" + strconv.Itoa(i)) })
				}
				waitQueued(t, l, queued)
				trips := rec.Trips()
				shut()
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Fatalf("Lock+Unlock: %v", err)
					}
				}
				// The queued SETs went in pipelines, at least one of them
				// carrying several (a slot that frees first may send a
				// lone one); 4 alone + 10 queued SETs took < 14 trips.
				sets, setTrips := 0, map[int]bool{}
				for _, cmd := range rec.Commands() {
					if cmd.Trip > trips && cmd.Name == "set" {
						sets++
						setTrips[cmd.Trip] = true
					}
				}
				if sets != slots+queued || len(setTrips) >= sets {
					t.Fatalf("%d SETs in %d round trips, want %d in fewer:\n%v", sets, len(setTrips), slots+queued, rec.Shapes())
				}
				for i := range queued {
					if n := c.Exists(ctx, l.LockKey("queued"+strconv.Itoa(i))).Val(); n != 0 {
						t.Fatalf("lock queued%d left after its Unlock", i)
					}
				}
			})
		}
	})
}

// takeEverySlot warms l up (a script has run, so Lock's first try is a SET
// NX), then holds every command of c at a gate and fills l's slots with
// lone TryLock calls held there; shut opens the gate, and wg ends with
// those calls.
func takeEverySlot(t *testing.T, c interface{ AddHook(redis.Hook) }, l *mutex.Locker) (shut func(), wg *sync.WaitGroup) {
	t.Helper()
	ctx := context.Background()
	if _, err := l.TryLock(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	hold, shut := testutil.HoldHook()
	c.AddHook(hold)
	wg = &sync.WaitGroup{}
	for i := range mutex.BatchSlots {
		wg.Go(func() { _, _ = l.TryLock(ctx, "alone"+strconv.Itoa(i)) })
	}
	waitFor(t, "every slot taken", func() bool { return mutex.BatchBusy(l) == mutex.BatchSlots })
	return shut, wg
}

// A call whose context ends while its command queues returns at once, and
// its command is never sent: no lock is taken for it.
func TestBatchedCallLeavesTheQueue(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		c, rec := recordedClient(t, b, &redis.Options{})
		l := mustNew(t, c, mutex.WithPrefix(b.Prefix))
		ctx := context.Background()
		shut, wg := takeEverySlot(t, c, l)
		defer shut()
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := l.Lock(short, "leaver")
		if !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock = %v, want ErrNotObtained and DeadlineExceeded", err)
		}
		if n := mutex.BatchQueued(l); n != 0 {
			t.Fatalf("%d commands still queued after their caller left", n)
		}
		shut()
		wg.Wait()
		for _, cmd := range rec.Commands() {
			for _, a := range cmd.Args {
				if a == l.LockKey("leaver") {
					t.Fatalf("the command of a call that left the queue was sent: %v", cmd)
				}
			}
		}
		if n := c.Exists(ctx, l.LockKey("leaver")).Val(); n != 0 {
			t.Fatal("a lock was taken for a call that left before its command was sent")
		}
	})
}

// A call whose context ends after its command was sent in a pipeline
// returns at once; when the reply comes, the lock it took for nobody is
// released (the client ignores deadlines, so the call's late reply is
// handled as an abandoned call's is). The context ends once the pipeline
// has run in Redis, not after a fixed time: a loaded machine took 200 ms
// before it sent the pipeline at all.
func TestBatchedCallLeftAfterSending(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		c := b.Client(t)
		l := mustNew(t, c, mutex.WithPrefix(b.Prefix))
		ctx := context.Background()
		// Every slot taken by a lone call held before Redis; then a pipeline
		// held after Redis ran it.
		shut, wg := takeEverySlot(t, c, l)
		defer shut()
		after, reply := testutil.HoldHook()
		defer reply()
		ran := make(chan struct{})
		c.AddHook(afterRedis{h: after, ran: sync.OnceFunc(func() { close(ran) })})
		short, cancel := context.WithCancel(ctx)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := l.Lock(short, "late")
			done <- err
		}()
		waitQueued(t, l, 1)
		shut() // the lone calls go, then the pipeline, held once Redis ran it
		select {
		case <-ran:
		case <-time.After(30 * time.Second):
			t.Fatal("the pipeline did not reach Redis in 30 s")
		}
		start := time.Now()
		cancel()
		err := <-done
		if !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Lock = %v, want ErrNotObtained and Canceled", err)
		}
		if waited := time.Since(start); waited > 5*time.Second {
			t.Fatalf("Lock returned %v after its context ended", waited)
		}
		key := l.LockKey("late")
		if c.Exists(ctx, key).Val() != 1 {
			t.Fatalf("the pipeline did not run in Redis before its reply was held (Lock: %v)", err)
		}
		reply()
		wg.Wait()
		waitFor(t, "the lock taken for nobody released", func() bool { return c.Exists(ctx, key).Val() == 0 })
	})
}

// afterRedis holds pipelines of SETs (not lone commands, nor go-redis's
// own pipelines that set a connection up) with a hook's wait after they ran
// in Redis: a reply that is late, not a command.
type afterRedis struct {
	h   redis.Hook
	ran func() // called once such a pipeline has run in Redis
}

func (a afterRedis) DialHook(next redis.DialHook) redis.DialHook { return next }

func (a afterRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (a afterRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	wait := a.h.ProcessPipelineHook(func(context.Context, []redis.Cmder) error { return nil })
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if sets(cmds) == 0 {
			return err
		}
		a.ran()
		if werr := wait(context.WithoutCancel(ctx), cmds); werr != nil {
			return werr
		}
		return err
	}
}

// With WithoutPipelining, overlapping calls never queue: each sends its own
// command at once, on a connection of its own.
func TestWithoutPipelining(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		c, rec := recordedClient(t, b, &redis.Options{})
		l := mustNew(t, c, mutex.WithPrefix(b.Prefix), mutex.WithoutPipelining())
		ctx := context.Background()
		if _, err := l.TryLock(ctx, "warm"); err != nil {
			t.Fatal(err)
		}
		gate := &arrivals{open: make(chan struct{})}
		c.AddHook(gate)
		defer gate.release()
		calls := 2 * mutex.BatchSlots
		trips := rec.Trips()
		var wg sync.WaitGroup
		for i := range calls {
			wg.Go(func() {
				if _, err := l.TryLock(ctx, "own"+strconv.Itoa(i)); err != nil {
					t.Errorf("TryLock: %v", err)
				}
			})
		}
		waitFor(t, "every call's command at the gate", func() bool { return gate.n.Load() == int64(calls) })
		gate.release()
		wg.Wait()
		setTrips := map[int]bool{}
		for _, cmd := range rec.Commands() {
			if cmd.Trip > trips && cmd.Name == "set" {
				setTrips[cmd.Trip] = true
			}
		}
		if len(setTrips) != calls {
			t.Fatalf("%d calls sent their SETs in %d round trips, want one each:\n%v", calls, len(setTrips), rec.Shapes())
		}
	})
}

// sets counts the SET commands of cmds.
func sets(cmds []redis.Cmder) int {
	n := 0
	for _, cmd := range cmds {
		if cmd.Name() == "set" {
			n++
		}
	}
	return n
}

// arrivals is a hook that counts the SET commands that reach it, and holds
// them until release (other commands, a connection's set-up, pass).
type arrivals struct {
	n    atomic.Int64
	open chan struct{}
	once sync.Once
}

func (a *arrivals) release() { a.once.Do(func() { close(a.open) }) }

func (a *arrivals) DialHook(next redis.DialHook) redis.DialHook { return next }

func (a *arrivals) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "set" {
			a.n.Add(1)
			<-a.open
		}
		return next(ctx, cmd)
	}
}

func (a *arrivals) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := sets(cmds); n > 0 {
			a.n.Add(int64(n))
			<-a.open
		}
		return next(ctx, cmds)
	}
}
