package reliability

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// TestServerStall stalls redis-server for three leases while holders keep
// taking the lock, reading a counter and committing counter+1 through
// UnlockWith: the server process stopped with SIGSTOP (its clock jumps when
// it continues), or all its clients paused with CLIENT PAUSE ALL or WRITE
// (its clock runs; it expires nothing during the pause). One holder, the
// staller, holds the lock when the stall begins and sends its commit during
// the stall, after its lease. The checker, from each holder's token and
// client-monotonic enter and leave (commit sent) times, finds no two holders
// whose commits landed with overlapping holds; the staller's commit is
// refused; no refused commit wrote; and the counter equals the number of
// commits that landed (no lost update).
func TestServerStall(t *testing.T) {
	const lease = 200 * time.Millisecond
	const stallFor = 3 * lease
	for _, tc := range []struct {
		name  string
		stall func(t *testing.T, srv *testutil.Server, admin *redis.Client) (end func())
	}{
		{"SIGSTOP", func(t *testing.T, srv *testutil.Server, _ *redis.Client) func() {
			return testutil.Freeze(t, srv.Pid())
		}},
		{"CLIENT PAUSE ALL", func(t *testing.T, _ *testutil.Server, admin *redis.Client) func() {
			testutil.PauseClients(t, admin, stallFor, "ALL")
			return func() {}
		}},
		{"CLIENT PAUSE WRITE", func(t *testing.T, _ *testutil.Server, admin *redis.Client) func() {
			testutil.PauseClients(t, admin, stallFor, "WRITE")
			return func() {}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			srv, admin := faultServer(t)
			prefix := testutil.NewPrefix()
			counter, log, _ := faultKeys(prefix, "job")
			const clients, workers = 2, 6
			lockers := make([]*mutex.Locker, clients)
			data := make([]*redis.Client, clients)
			for i := range clients {
				data[i] = srv.Client(t)
				lockers[i] = mustLocker(t, data[i], mutex.WithPrefix(prefix), mutex.WithTTL(lease), mutex.WithRetryInterval(10*time.Millisecond))
			}
			faultWarm(t, lockers[0], prefix)
			faultWarm(t, lockers[1], prefix)

			holds := &faultHolds{}
			commit := func(lk *mutex.Lock, v int64, enter, leave time.Time) error {
				_, err := lk.UnlockWith(ctx, mutex.Call{Fragment: faultCommit, Keys: []string{counter, log}, Args: []any{v + 1, lk.Token()}})
				h := faultHold{token: lk.Token(), enter: enter, leave: leave, outcome: faultLanded}
				switch {
				case errors.Is(err, mutex.ErrNotHeld):
					h.outcome = faultRefused
				case err != nil:
					h.outcome = faultUnknown
				}
				holds.add(h)
				return err
			}
			stop := make(chan struct{})
			var lockErrs atomic.Int64
			var wg sync.WaitGroup
			for w := range workers {
				l, c := lockers[w%clients], data[w%clients]
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
						lk, err := l.Lock(lctx, "job")
						cancel()
						if err != nil {
							lockErrs.Add(1)
							time.Sleep(5 * time.Millisecond)
							continue
						}
						enter := time.Now()
						v, err := faultGet(ctx, c, counter)
						if err != nil {
							t.Errorf("GET: %v", err)
							_ = lk.Unlock(ctx)
							continue
						}
						faultBusy(rand.N(time.Millisecond))
						if err := commit(lk, v, enter, time.Now()); err != nil && !errors.Is(err, mutex.ErrNotHeld) {
							t.Logf("commit of unknown outcome: %v", err)
						}
					}
				})
			}
			finish := func() {
				if !faultStopLoad(stop, &wg, 15*time.Second) {
					t.Fatalf("holders still running 15 s after the load stopped")
				}
			}
			defer finish()

			// The holders run before the stall (a commit lands), however slow
			// the machine.
			time.Sleep(300 * time.Millisecond)
			if !faultUntil(func() bool { _, landed, _, _ := holds.check(); return landed > 0 }) {
				t.Fatal("no commit landed before the stall: the holders did not run")
			}
			// The staller takes the lock among the others, and holds it when
			// the stall begins.
			sctx, cancel := context.WithTimeout(ctx, 60*time.Second) // a hang, not a speed target
			slk, err := lockers[0].Lock(sctx, "job")
			cancel()
			if err != nil {
				t.Fatalf("staller: Lock: %v", err)
			}
			senter := time.Now()
			sv, err := faultGet(ctx, data[0], counter)
			if err != nil {
				t.Fatal(err)
			}
			stalled := time.Now()
			end := tc.stall(t, srv, admin)
			time.Sleep(lease + 50*time.Millisecond)
			sleave := time.Now()
			scommit := make(chan error, 1)
			go func() { scommit <- commit(slk, sv, senter, sleave) }()
			time.Sleep(stallFor - time.Since(stalled))
			end()
			serr := <-scommit
			time.Sleep(500 * time.Millisecond) // holders carry on after the stall
			finish()

			overlaps, landed, refused, unknown := holds.check()
			for _, o := range overlaps {
				t.Errorf("two holders whose commits landed overlapped: %s", o)
			}
			if !errors.Is(serr, mutex.ErrNotHeld) {
				t.Errorf("the staller's commit, sent %v after its lease began during the stall = %v; want ErrNotHeld", sleave.Sub(senter), serr)
			}
			writers, err := admin.LRange(ctx, log, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			outcome := holds.outcomes()
			stale := 0
			for _, w := range writers {
				if o, ok := outcome[w]; ok && o == faultRefused {
					stale++
				}
			}
			if stale != 0 {
				t.Errorf("%d commits refused with ErrNotHeld wrote anyway", stale)
			}
			n, err := faultGet(ctx, admin, counter)
			if err != nil {
				t.Fatal(err)
			}
			// The warm-up wrote nothing here (it uses its own name).
			if n != int64(len(writers)) {
				t.Errorf("counter %d after %d commits landed: lost updates", n, len(writers))
			}
			if got := len(writers); got < landed || got > landed+unknown {
				t.Errorf("%d commits in the log, %d landed and %d of unknown outcome", got, landed, unknown)
			}
			if landed == 0 {
				t.Error("no commit landed: the holders did not run")
			}
			fault := tc.name + " for " + stallFor.String() + ", lease " + lease.String()
			t.Logf("%d landed, %d refused, %d unknown, %d lock errors; counter %d", landed, refused, unknown, lockErrs.Load(), n)
			faultFigure(t, "stall: overlapping holders whose commits landed", fault, "%d (%d landed, %d refused, %d unknown)", len(overlaps), landed, refused, unknown)
			faultFigure(t, "stall: stale writes landed", fault, "%d (staller's commit: %v)", stale, serr)
		})
	}
}
