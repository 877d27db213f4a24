package reliability

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// The helpers of the fault tests (network, restart, paused holder, stall,
// over-admission). Their names start with "fault" so that they cannot clash
// with the other tests of the package.

// faultFigure records one measured figure in the form that RELIABILITY.md
// collects (go test -v ./internal/reliability/ | grep FIGURE):
//
//	FIGURE <property> | <fault> | <value>
//
// Each figure is one line: newlines (from joined errors) become "; ".
func faultFigure(t testing.TB, property, fault, format string, a ...any) {
	t.Helper()
	value := strings.ReplaceAll(fmt.Sprintf(format, a...), "\n", "; ")
	t.Logf("FIGURE %s | %s | %s", property, fault, value)
}

// faultCommit is a commit-while-held write (Lock.UnlockWith): it sets the
// counter KEYS[1] to ARGV[1] and appends the writer ARGV[2] to the log list
// KEYS[2], so the test can tell which commits landed, and whose.
var faultCommit = mutex.NewFragment(`redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1`)

// faultKeys returns the counter and log keys guarded by the lock on name, in
// its cluster slot, and the lock's own key (to check for orphans on the
// server directly).
func faultKeys(prefix, name string) (counter, log, lock string) {
	// What Locker.Key returns.
	return keyspace.Key(prefix, name, "n"), keyspace.Key(prefix, name, "log"), keyspace.Key(prefix, name, "lock")
}

// faultWarm takes, extends, commits through and unlocks a lock of l (whose
// key prefix is prefix) on a name of its own, so that the lock's scripts are
// in the server's script cache and a connection is open: the fault then hits
// the call under test, and not the EVALSHA that finds no script (go-redis's
// Script.Run then needs a second round trip, EVAL, for the first use).
func faultWarm(t testing.TB, l *mutex.Locker, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const name = "warm-up"
	counter, log, _ := faultKeys(prefix, name)
	for _, commit := range []bool{true, false} {
		// A lease of its own: with the Locker's (300 ms in some tests), a
		// stall between Lock and Extend on a loaded machine failed the
		// warm-up.
		lk, err := l.Lock(ctx, name, mutex.WithTTL(10*time.Second))
		if err != nil {
			t.Fatalf("warm-up Lock: %v", err)
		}
		if err := lk.Extend(ctx, 10*time.Second); err != nil {
			t.Fatalf("warm-up Extend: %v", err)
		}
		if commit {
			_, err = lk.UnlockWith(ctx, mutex.Call{Fragment: faultCommit, Keys: []string{counter, log}, Args: []any{0, "warm-up"}})
		} else {
			err = lk.Unlock(ctx)
		}
		if err != nil {
			t.Fatalf("warm-up unlock: %v", err)
		}
	}
}

// faultGet reads an integer key; a missing key is 0.
func faultGet(ctx context.Context, c *redis.Client, key string) (int64, error) {
	n, err := c.Get(ctx, key).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// faultClosed reports whether ch is closed, without waiting.
func faultClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// faultHang bounds a wait for something that must happen, however loaded the
// machine: long enough never to fail a correct run, short enough to end a
// hung one with a message. It is not a measurement.
const faultHang = 10 * time.Second

// faultUntil polls cond every 10 ms until it holds, for at most faultHang,
// and reports whether it held: for a test that waits for its scenario to
// reach a state instead of sleeping for as long as that usually takes.
func faultUntil(cond func() bool) bool {
	for deadline := time.Now().Add(faultHang); !cond(); {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// faultWithin waits up to d for ch to close and reports whether it did.
func faultWithin(ch <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// faultNoOrphan checks on the server itself that key (a lock) is gone, or
// has a lease of at most ttl and is gone once that lease has passed: no lock
// key outlives its TTL (nothing renews a lock that its holder gave up or
// lost, nothing writes a lock without a lease).
func faultNoOrphan(t testing.TB, admin *redis.Client, key string, ttl time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ttl+10*time.Second)
	defer cancel()
	pttl, err := admin.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	switch {
	case pttl == -2*time.Nanosecond || pttl == -2*time.Millisecond: // go-redis reports -2 as a Duration of -2
		return
	case pttl < 0:
		t.Fatalf("lock key %s has no TTL (PTTL %v): it would never expire", key, pttl)
	case pttl > ttl:
		t.Fatalf("lock key %s has PTTL %v > the lease %v", key, pttl, ttl)
	}
	time.Sleep(pttl + 20*time.Millisecond)
	if n, err := admin.Exists(ctx, key).Result(); err != nil || n != 0 {
		after, _ := admin.PTTL(ctx, key).Result()
		t.Fatalf("lock key %s still exists %v after its PTTL of %v (now PTTL %v, err %v): something renewed an abandoned lock",
			key, pttl+20*time.Millisecond, pttl, after, err)
	}
}

// faultContender is the checker of a holder that may lose its lock: it tries
// to take the lock on name every few milliseconds through its own Locker (a
// direct connection, untouched by the fault), and each time it gets the lock
// it checks that the holder has reported the loss (Done closed). The holder
// may report it slightly late only because its deadline timer needs to be
// scheduled: grace bounds that; a lock that was silently lost (Done never
// closes, or closes a lease too late) fails the check.
type faultContender struct {
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	wins    int           // acquisitions
	overlap int           // acquisitions while the holder still believed it held
	maxLag  time.Duration // longest wait for the holder's report after a win
	first   time.Time     // first acquisition
}

func startFaultContender(t testing.TB, l *mutex.Locker, name string, lease, grace time.Duration, holder *mutex.Lock) *faultContender {
	c := &faultContender{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		ctx := context.Background()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tick.C:
			}
			actx, cancel := context.WithTimeout(ctx, time.Second)
			lk, err := l.TryLock(actx, name, mutex.WithTTL(lease))
			cancel()
			if err != nil {
				if !errors.Is(err, mutex.ErrLocked) {
					t.Errorf("contender: TryLock: %v", err)
					return
				}
				continue
			}
			got := time.Now()
			var lag time.Duration
			ok := faultClosed(holder.Done())
			if !ok {
				ok = faultWithin(holder.Done(), grace)
				lag = time.Since(got)
			}
			c.mu.Lock()
			c.wins++
			if c.first.IsZero() {
				c.first = got
			}
			if !ok {
				c.overlap++
			}
			c.maxLag = max(c.maxLag, lag)
			n := c.overlap
			c.mu.Unlock()
			if !ok && n <= 3 { // the figure counts the rest
				t.Errorf("contender took the lock %q while its holder still reported it held (Done open %v after): two holders", name, grace)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Errorf("contender: Unlock: %v", err)
			}
		}
	}()
	return c
}

// halt stops the contender and waits for it.
func (c *faultContender) halt() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

func (c *faultContender) result() (wins, overlap int, maxLag time.Duration, first time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wins, c.overlap, c.maxLag, c.first
}

// faultHold is one holder's possession of the lock as a stall test's
// checker sees it: the lock's token, the client-monotonic times at which the
// holder had the acquisition's reply (enter) and sent its commit (leave), and
// what became of the commit. A commit that landed ran while the token still
// held the lock, so the [enter, leave] of two landed commits cannot overlap:
// the second acquisition followed the first commit on the server, and the
// first commit was sent before it ran.
type faultHold struct {
	token        string
	enter, leave time.Time
	outcome      faultOutcome
}

type faultOutcome int

const (
	faultLanded  faultOutcome = iota // UnlockWith returned the fragment's result
	faultRefused                     // ErrNotHeld: the fragment did not run
	faultUnknown                     // a Redis error: it may have run
)

// faultHolds collects holds from many goroutines.
type faultHolds struct {
	mu    sync.Mutex
	holds []faultHold
}

func (h *faultHolds) add(x faultHold) {
	h.mu.Lock()
	h.holds = append(h.holds, x)
	h.mu.Unlock()
}

// check returns the pairs of landed holds whose [enter, leave] intervals
// overlap, and the counts of each outcome.
func (h *faultHolds) check() (overlaps []string, landed, refused, unknown int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ls []faultHold
	for _, x := range h.holds {
		switch x.outcome {
		case faultLanded:
			landed++
			ls = append(ls, x)
		case faultRefused:
			refused++
		default:
			unknown++
		}
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i].enter.Before(ls[j].enter) })
	// Sorted by enter, the intervals are disjoint iff each begins after
	// every earlier one ended: after the one among them that ended last.
	var last faultHold
	for i, x := range ls {
		if i > 0 && !x.enter.After(last.leave) {
			overlaps = append(overlaps, fmt.Sprintf("%s held until %v, %s entered %v earlier",
				last.token[:8], last.leave.Format("15:04:05.000000"), x.token[:8], last.leave.Sub(x.enter)))
		}
		if i == 0 || x.leave.After(last.leave) {
			last = x
		}
	}
	return overlaps, landed, refused, unknown
}

// outcomes returns the outcome of each token's hold.
func (h *faultHolds) outcomes() map[string]faultOutcome {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := make(map[string]faultOutcome, len(h.holds))
	for _, x := range h.holds {
		m[x.token] = x.outcome
	}
	return m
}

// faultBound is the most a rule can admit in a span of elapsed server time
// that starts with an empty funnel: its capacity, what leaks meanwhile
// (rounded up), and one unit for an admission exactly on a unit's boundary.
func faultBound(rule funnel.Rule, elapsed time.Duration) int64 {
	per := rule.Per.Microseconds()
	leaked := (elapsed.Microseconds()*rule.Leak + per - 1) / per
	return rule.Capacity + leaked + 1
}

// faultFirst records, from many goroutines, the first time after some
// point at which something succeeded (client monotonic clock).
type faultFirst struct {
	mu    sync.Mutex
	first time.Time
}

// mark records now if it is after after (a zero after: not yet).
func (f *faultFirst) mark(now, after time.Time) {
	if after.IsZero() || !now.After(after) {
		return
	}
	f.mu.Lock()
	if f.first.IsZero() || now.Before(f.first) {
		f.first = now
	}
	f.mu.Unlock()
}

// since returns the time from after to the first success, or false if none.
func (f *faultFirst) since(after time.Time) (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.first.IsZero() {
		return 0, false
	}
	return f.first.Sub(after), true
}

// faultServer starts a redis-server of the test's own (to kill, pause or put
// behind a proxy) and a client of it that the fault never touches.
func faultServer(t *testing.T) (*testutil.Server, *redis.Client) {
	t.Helper()
	srv := testutil.StartServer(t)
	return srv, srv.Client(t)
}

// faultLockWithin runs one Lock of name with a ctx deadline and returns how
// long it took and what it returned; the caller judges both.
func faultLockWithin(l *mutex.Locker, name string, deadline time.Duration) (time.Duration, *mutex.Lock, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	lk, err := l.Lock(ctx, name)
	return time.Since(start), lk, err
}

// faultStopLoad closes stop (once) and waits up to bound for wg; it reports
// whether the load ended in time.
func faultStopLoad(stop chan struct{}, wg *sync.WaitGroup, bound time.Duration) bool {
	select {
	case <-stop:
	default:
		close(stop)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return faultWithin(done, bound)
}
