package reliability

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// Phases of a kill/restart run, as the load goroutines see them.
const (
	faultUp         int32 = iota // before the kill
	faultDown                    // killed (the process has exited), not restarting yet
	faultRestarting              // a new server is starting
	faultRestarted               // the new server answers PING
)

// TestKillRestartUnderLoad kills redis-server with SIGKILL while goroutines
// lock and unlock (on four Lockers) and ask a guard (on four clients) without
// pause, keeps it down, then starts a new, empty server on the same address.
// It checks that the guard, failing closed, admits nothing while no server
// runs (decisions that began and ended in that span); that locks and
// admissions work again after the restart (the time to the first of each is
// a figure); and that every goroutine ends within a bound once the load
// stops: no call deadlocks on a dead connection. testutil.Main checks for
// leaked goroutines when the package ends.
func TestKillRestartUnderLoad(t *testing.T) {
	const (
		clients      = 4
		lockWorkers  = 8
		guardWorkers = 8
		downFor      = 700 * time.Millisecond
	)
	srv, _ := faultServer(t)
	prefix := testutil.NewPrefix()
	rule := funnel.Rule{Name: "busy", Capacity: 100, Leak: 1000, Per: time.Second}
	lockers := make([]*mutex.Locker, clients)
	guards := make([]*guard.Guard, clients)
	for i := range clients {
		c := srv.Client(t)
		lockers[i] = mustLocker(t, c, mutex.WithPrefix(prefix), mutex.WithTTL(time.Second), mutex.WithRetryInterval(10*time.Millisecond))
		g, err := guard.New(srv.Client(t), guard.WithPrefix(prefix+"g:"), guard.WithRules(rule), guard.WithTimeout(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		guards[i] = g
	}

	var (
		phase                           atomic.Int32
		restartedAt                     atomic.Pointer[time.Time]
		locks, lockErrs                 atomic.Int64
		decisions, allowed, errs        atomic.Int64
		downDecisions, downAllowed      atomic.Int64
		firstLockAfter, firstAllowAfter faultFirst
	)
	after := func() time.Time {
		if p := restartedAt.Load(); p != nil {
			return *p
		}
		return time.Time{}
	}
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup
	for w := range lockWorkers {
		l := lockers[w%clients]
		name := []string{"a", "b"}[w%2]
		wg.Go(func() {
			bg := context.Background()
			for !stopped() {
				ctx, cancel := context.WithTimeout(bg, time.Second)
				lk, err := l.Lock(ctx, name)
				cancel()
				if err != nil {
					lockErrs.Add(1)
					time.Sleep(5 * time.Millisecond)
					continue
				}
				firstLockAfter.mark(time.Now(), after())
				locks.Add(1)
				faultBusy(100 * time.Microsecond)
				if err := lk.Unlock(bg); err != nil && !errors.Is(err, mutex.ErrNotHeld) {
					lockErrs.Add(1) // the server died under the holder: the lease ends it
				}
			}
		})
	}
	for w := range guardWorkers {
		g := guards[w%clients]
		key := []string{"+1", "+2", "+3"}[w%3]
		wg.Go(func() {
			bg := context.Background()
			for !stopped() {
				p0 := phase.Load()
				d, err := g.Allow(bg, key)
				p1 := phase.Load()
				decisions.Add(1)
				if d.Allowed {
					allowed.Add(1)
					firstAllowAfter.mark(time.Now(), after())
				}
				if p0 == faultDown && p1 == faultDown {
					downDecisions.Add(1)
					if d.Allowed {
						downAllowed.Add(1)
						t.Errorf("guard admitted while no server ran: %+v, %v", d, err)
					}
				}
				if err != nil {
					errs.Add(1)
					if !errors.Is(err, guard.ErrUnavailable) {
						t.Errorf("guard error without ErrUnavailable: %v", err)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	// However the test ends, the load stops and is waited for (bounded).
	finish := func() {
		if !faultStopLoad(stop, &wg, 15*time.Second) {
			var b bytes.Buffer
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("load goroutines still running 15 s after the load stopped: deadlock?\n%s", b.String())
		}
	}
	defer finish()

	// The load runs before the kill, and the guard decides while no server
	// runs: waited for, not assumed from the time a fast machine needs.
	time.Sleep(500 * time.Millisecond)
	if !faultUntil(func() bool { return locks.Load() > 0 && allowed.Load() > 0 }) {
		t.Fatalf("no load before the kill: %d locks, %d admissions", locks.Load(), allowed.Load())
	}
	before := [2]int64{locks.Load(), allowed.Load()}
	srv.Kill()
	phase.Store(faultDown)
	time.Sleep(downFor)
	faultUntil(func() bool { return downDecisions.Load() > 0 })
	phase.Store(faultRestarting)
	if err := srv.Restart(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	restarted := time.Now()
	restartedAt.Store(&restarted)
	phase.Store(faultRestarted)
	for waited := time.Duration(0); waited < 10*time.Second; waited += 10 * time.Millisecond {
		_, locked := firstLockAfter.since(restarted)
		_, admitted := firstAllowAfter.since(restarted)
		if locked && admitted {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	stoppedAt := time.Now()
	finish()
	drain := time.Since(stoppedAt)

	lockAfter, locked := firstLockAfter.since(restarted)
	allowAfter, admitted := firstAllowAfter.since(restarted)
	if !locked {
		t.Errorf("no lock acquired in 10 s after the restart")
	}
	if !admitted {
		t.Errorf("no admission in 10 s after the restart")
	}
	if downDecisions.Load() == 0 {
		t.Errorf("no guard decision began and ended while the server was down: the fail-closed path was not exercised")
	}
	t.Logf("before the kill: %d locks, %d admissions; in all: %d locks (%d errors), %d decisions (%d allowed, %d errors)",
		before[0], before[1], locks.Load(), lockErrs.Load(), decisions.Load(), allowed.Load(), errs.Load())
	fault := "kill -9, down " + downFor.String() + ", restart empty"
	faultFigure(t, "guard FailClosed: admissions while down", fault, "%d of %d decisions", downAllowed.Load(), downDecisions.Load())
	faultFigure(t, "time to first acquire after recovery", fault, "%v", lockAfter.Round(time.Millisecond))
	faultFigure(t, "time to first admission after recovery", fault, "%v", allowAfter.Round(time.Millisecond))
	faultFigure(t, "load goroutines ended after load stopped", fault, "%d of %d within %v", lockWorkers+guardWorkers, lockWorkers+guardWorkers, drain.Round(time.Millisecond))
}

// faultBusy spins for d: a critical section so short that a sleep's timer
// granularity would dominate it.
func faultBusy(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
		runtime.Gosched()
	}
}
