package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// raceRounds is how many rounds each handle race runs; FUNNELGUARD_RACE_ROUNDS
// raises it (the 10,000) for a long run.
func raceRounds(t *testing.T, short int) int {
	if s := os.Getenv("FUNNELGUARD_RACE_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("FUNNELGUARD_RACE_ROUNDS=%q: want a positive integer", s)
		}
		return n
	}
	return short
}

// A racer is one way to end or use a handle, raced by many goroutines at
// once. Its writes go to data, a key of the lock's name. ended reports
// whether its answer says that it, and no other call, ended the handle (for
// Unlock and UnlockWith: a nil error).
type racer struct {
	name  string
	call  func(ctx context.Context, lk *mutex.Lock, data string) error
	ended func(err error) bool
}

// bump writes under the lock: a write that lands while another owner holds
// the name shows in its count.
var bump = mutex.NewFragment("redis.call('INCR', KEYS[1]) return 1")

var (
	raceUnlock = racer{"Unlock", func(ctx context.Context, lk *mutex.Lock, _ string) error {
		return lk.Unlock(ctx)
	}, func(err error) bool { return err == nil }}
	raceUnlockWith = racer{"UnlockWith", func(ctx context.Context, lk *mutex.Lock, data string) error {
		_, err := lk.UnlockWith(ctx, mutex.Call{Fragment: bump, Keys: []string{data}})
		return err
	}, func(err error) bool { return err == nil }}
	raceExtend = racer{"Extend", func(ctx context.Context, lk *mutex.Lock, _ string) error {
		return lk.Extend(ctx, 10*time.Second)
	}, func(error) bool { return false }}
	raceRun = racer{"Run", func(ctx context.Context, lk *mutex.Lock, data string) error {
		_, err := lk.Run(ctx, mutex.Call{Fragment: bump, Keys: []string{data}})
		return err
	}, func(error) bool { return false }}
)

// TestHandleRaces races the methods of one handle against each other, with
// and without a waiter of the same Locker and a contender of another: never
// two owners of the name, exactly one call ends the handle, and every other
// call gets ErrNotHeld or succeeded before the end.
func TestHandleRaces(t *testing.T) {
	mixes := []struct {
		name    string
		racers  []racer
		callers int
	}{
		{"2 Unlocks", []racer{raceUnlock}, 2},
		{"64 Unlocks", []racer{raceUnlock}, 64},
		{"UnlockWith and Unlock", []racer{raceUnlockWith, raceUnlock}, 2},
		{"Extend and Unlock", []racer{raceExtend, raceUnlock}, 4},
		{"Run and Unlock", []racer{raceRun, raceUnlock}, 4},
		{"all four", []racer{raceUnlock, raceUnlockWith, raceExtend, raceRun}, 16},
	}
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		rounds := raceRounds(t, 60)
		if !b.Real() {
			rounds = min(rounds, 20)
		}
		for _, m := range mixes {
			for _, waiter := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s, waiter %v", m.name, waiter), func(t *testing.T) {
					c := b.Client(t)
					l := newLocker(t, b, mutex.WithRetryInterval(time.Millisecond))
					other := newLocker(t, b, mutex.WithRetryInterval(time.Millisecond))
					for round := range rounds {
						if err := raceRound(c, l, other, m.racers, m.callers, waiter, fmt.Sprintf("race-%d", round)); err != nil {
							t.Fatalf("round %d: %v", round, err)
						}
					}
				})
			}
		}
	})
}

// raceRound runs one round of racers on a fresh handle of name, and checks
// the outcome: one owner at a time, one end.
func raceRound(c *redis.Client, l, other *mutex.Locker, racers []racer, callers int, waiter bool, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	data, err := l.Key(name, "data")
	if err != nil {
		return err
	}
	defer c.Del(context.Background(), data)
	lk, err := l.Lock(ctx, name)
	if err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	got := make(chan *mutex.Lock, 1)
	if waiter {
		go func() {
			w, err := l.Lock(ctx, name)
			if err != nil {
				w = nil
			}
			got <- w
		}()
		for mutex.QueueLen(l, name) == 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
	errs := make([]error, callers)
	var start, wg sync.WaitGroup
	start.Add(1)
	for i := range callers {
		r := racers[i%len(racers)]
		wg.Go(func() {
			start.Wait()
			errs[i] = r.call(ctx, lk, data)
		})
	}
	start.Done()
	wg.Wait()
	ends := 0
	for i, err := range errs {
		r := racers[i%len(racers)]
		switch {
		case r.ended(err):
			ends++
		case err != nil && !errors.Is(err, mutex.ErrNotHeld):
			return fmt.Errorf("%s: %v", r.name, err)
		}
	}
	enders := false
	for _, r := range racers {
		enders = enders || r.ended(nil)
	}
	if enders && ends != 1 {
		return fmt.Errorf("%d calls ended the handle, want exactly 1 (%v)", ends, errs)
	}
	if err := lk.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) && enders {
		return fmt.Errorf("Unlock after the race = %v, want ErrNotHeld", err)
	}
	if waiter {
		w := <-got
		if w == nil {
			return errors.New("the waiter got no lock")
		}
		before, _ := c.Get(ctx, data).Int()
		if second, err := other.TryLock(ctx, name); !errors.Is(err, mutex.ErrLocked) {
			if err == nil {
				_ = second.Unlock(ctx)
			}
			return fmt.Errorf("while the waiter holds the lock, another Locker's TryLock = %v, want ErrLocked: two owners", err)
		}
		if err := w.Extend(ctx, 10*time.Second); err != nil {
			return fmt.Errorf("the waiter's Extend = %v: its lock is gone", err)
		}
		if after, _ := c.Get(ctx, data).Int(); after != before {
			return fmt.Errorf("the raced handle wrote %d times while the waiter held the lock", after-before)
		}
		if err := w.Unlock(ctx); err != nil {
			return fmt.Errorf("the waiter's Unlock = %v", err)
		}
	}
	// The name is free: another Locker takes it at once.
	free, err := other.TryLock(ctx, name)
	if err != nil {
		return fmt.Errorf("after the round, another Locker's TryLock = %v, want the lock", err)
	}
	return free.Unlock(ctx)
}

// holdBack is a hook that holds every command naming key until release is
// closed, reporting each one it holds on held.
type holdBack struct {
	key     string
	held    chan struct{}
	release chan struct{}
}

func (h *holdBack) names(cmd redis.Cmder) bool {
	for _, a := range cmd.Args() {
		if a == h.key {
			return true
		}
	}
	return false
}

func (h *holdBack) wait(cmds ...redis.Cmder) {
	for _, cmd := range cmds {
		if h.names(cmd) {
			select {
			case <-h.release: // let through: a NOSCRIPT retry, or later calls
			case h.held <- struct{}{}:
				<-h.release
			}
			return
		}
	}
}

func (h *holdBack) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdBack) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.wait(cmd)
		return next(ctx, cmd)
	}
}

func (h *holdBack) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.wait(cmds...)
		return next(ctx, cmds)
	}
}

// TestRunInFlightDuringHandOver: a Run of a handle still on its way to Redis
// when the handle is unlocked with a waiter of the same Locker queued must
// not write under the waiter's lock. (A hand-over without a round trip keeps
// the token, so the Run would find "its" lock held and write.)
func TestRunInFlightDuringHandOver(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c := b.Client(t)
		l := mustNew(t, c, mutex.WithPrefix(b.Prefix), mutex.WithRetryInterval(time.Millisecond))
		data := mustKey(t, l, "inflight", "data")
		hook := &holdBack{key: data, held: make(chan struct{}), release: make(chan struct{})}
		c.AddHook(hook)
		lk, err := l.Lock(ctx, "inflight")
		if err != nil {
			t.Fatal(err)
		}
		ran := make(chan error, 1)
		go func() {
			_, err := lk.Run(ctx, mutex.Call{Fragment: bump, Keys: []string{data}})
			ran <- err
		}()
		<-hook.held // the Run is on its way
		got := make(chan *mutex.Lock, 1)
		go func() {
			w, err := l.Lock(ctx, "inflight")
			if err != nil {
				t.Errorf("waiter: %v", err)
			}
			got <- w
		}()
		waitFor(t, "the waiter to queue", func() bool { return mutex.QueueLen(l, "inflight") == 1 })
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		w := <-got
		if w == nil {
			t.FailNow()
		}
		close(hook.release)
		runErr := <-ran
		n, _ := c.Get(ctx, data).Int()
		if n != 0 || runErr == nil {
			t.Fatalf("the unlocked handle's Run = %v and wrote %d times under the waiter's lock; want ErrNotHeld and no write", runErr, n)
		}
		if !errors.Is(runErr, mutex.ErrNotHeld) {
			t.Fatalf("Run = %v, want ErrNotHeld", runErr)
		}
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
