package funnel_test

// The tests of this file run the Limiter on more than one server: on a Redis
// Cluster of three masters through a *redis.ClusterClient, and on a
// sentinel-monitored master and replica through redis.NewFailoverClient
// (testutil.ScaleOut). On the cluster, a script whose keys (the lock's and
// the state's) fall in different slots fails with CROSSSLOT, so every call
// that passes here also shows that they share one.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// braceKeys are keys with braces; unescaped, "}{" and "{}" would split the
// keys of one funnel over slots.
var braceKeys = []string{"{", "}", "a{b}c", "}{", "{}", "sms:{+8613800138000}"}

// scaleLimiter returns a Limiter on a fresh client of d, under d's prefix.
func scaleLimiter(t *testing.T, d *testutil.Deployment) *funnel.Limiter {
	return mustLimiter(t, d.Client(t), funnel.WithPrefix(d.Prefix))
}

// hourly admits a burst of 3, then one unit an hour: within a test the leak
// is negligible (a second leaks 1/3600 of a unit).
var hourly = funnel.Rule{Name: "hour", Capacity: 3, Leak: 1, Per: time.Hour}

func TestClusterAllowDeniesWithRetryAfter(t *testing.T) {
	testutil.ScaleOut(t, func(t *testing.T, d *testutil.Deployment) {
		ctx := context.Background()
		lim := scaleLimiter(t, d)
		for _, key := range braceKeys {
			for i := range int64(3) {
				res, err := lim.Allow(ctx, key, hourly)
				if err != nil {
					t.Fatalf("Allow(%q) #%d: %v", key, i, err)
				}
				if !res.Allowed || res.Remaining != 2-i {
					t.Fatalf("Allow(%q) #%d = %+v, want allowed with %d remaining", key, i, res, 2-i)
				}
			}
			res, err := lim.Allow(ctx, key, hourly)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed || res.Rule != "hour" || res.RetryAfter <= 59*time.Minute || res.RetryAfter > time.Hour {
				t.Fatalf("Allow(%q) past the burst = %+v, want denied by \"hour\" with RetryAfter just under 1h", key, res)
			}
		}
	})
}

// Three rules are decided together: a call denied by one takes nothing from
// the others.
func TestClusterThreeRulesAllOrNothing(t *testing.T) {
	testutil.ScaleOut(t, func(t *testing.T, d *testutil.Deployment) {
		ctx := context.Background()
		lim := scaleLimiter(t, d)
		wide := funnel.Rule{Name: "wide", Capacity: 10, Leak: 1, Per: time.Hour}
		narrow := funnel.Rule{Name: "narrow", Capacity: 2, Leak: 1, Per: time.Hour}
		day := funnel.AtMost(5, 24*time.Hour)
		for _, key := range braceKeys {
			for i := range 2 {
				if res, err := lim.Allow(ctx, key, wide, narrow, day); err != nil || !res.Allowed {
					t.Fatalf("Allow(%q) #%d = %+v, %v; want allowed", key, i, res, err)
				}
			}
			for i := range 3 {
				res, err := lim.Allow(ctx, key, wide, narrow, day)
				if err != nil || res.Allowed || res.Rule != "narrow" {
					t.Fatalf("denied Allow(%q) #%d = %+v, %v; want denied by narrow", key, i, res, err)
				}
			}
			// Only the two admissions count against "wide" and the daily rule.
			res, err := lim.Peek(ctx, key, wide)
			if err != nil || res.Remaining != 8 {
				t.Fatalf("Peek(%q, wide) = %+v, %v; want 8 remaining", key, res, err)
			}
			res, err = lim.Peek(ctx, key, day)
			if err != nil || res.Remaining != 3 {
				t.Fatalf("Peek(%q, day) = %+v, %v; want 3 remaining", key, res, err)
			}
		}
	})
}

func TestClusterPeekRefundReset(t *testing.T) {
	testutil.ScaleOut(t, func(t *testing.T, d *testutil.Deployment) {
		ctx := context.Background()
		lim := scaleLimiter(t, d)
		for _, key := range braceKeys {
			for range 3 {
				if res, err := lim.Allow(ctx, key, hourly); err != nil || !res.Allowed {
					t.Fatalf("Allow(%q) = %+v, %v", key, res, err)
				}
			}
			for i := range 2 { // Peek changes nothing
				res, err := lim.Peek(ctx, key, hourly)
				if err != nil || res.Allowed || res.RetryAfter <= 59*time.Minute {
					t.Fatalf("Peek(%q) #%d of a full funnel = %+v, %v; want denied, RetryAfter ~1h", key, i, res, err)
				}
			}
			if err := lim.Refund(ctx, key, 1, hourly); err != nil {
				t.Fatalf("Refund(%q) = %v", key, err)
			}
			if res, err := lim.Peek(ctx, key, hourly); err != nil || !res.Allowed || res.Remaining != 1 {
				t.Fatalf("Peek(%q) after Refund = %+v, %v; want allowed, 1 remaining", key, res, err)
			}
			if res, err := lim.Allow(ctx, key, hourly); err != nil || !res.Allowed || res.Remaining != 0 {
				t.Fatalf("Allow(%q) after Refund = %+v, %v; want allowed, 0 remaining", key, res, err)
			}
			if res, err := lim.Allow(ctx, key, hourly); err != nil || res.Allowed {
				t.Fatalf("second Allow(%q) after Refund = %+v, %v; want denied", key, res, err)
			}
			if err := lim.Reset(ctx, key); err != nil {
				t.Fatalf("Reset(%q) = %v", key, err)
			}
			if res, err := lim.Peek(ctx, key, hourly); err != nil || !res.Allowed || res.Remaining != 3 {
				t.Fatalf("Peek(%q) after Reset = %+v, %v; want an empty funnel, 3 remaining", key, res, err)
			}
		}
	})
}

// failoverLease is the lease of the stress lockers in TestFailoverLocksAndAllow.
const failoverLease = time.Second

// A grant is one acquisition of a lock in TestFailoverLocksAndAllow, timed on
// the client's monotonic clock.
type grant struct {
	name, token      string
	acqStart, acqEnd time.Time // Lock called, Lock returned
	relStart, relEnd time.Time // first UnlockWith called, last returned
	lease            time.Duration
	committed        bool // an UnlockWith returned nil: the write landed
	firstNotHeld     bool // the first UnlockWith returned ErrNotHeld: nothing written
}

// holdEnd is the last moment the holder surely held the lock on the server
// it took it on: its release began, or its lease passed (less a margin).
func (g grant) holdEnd() time.Time {
	end := g.acqStart.Add(g.lease - 10*time.Millisecond)
	if g.relStart.Before(end) {
		return g.relStart
	}
	return end
}

// epoch says on which master a grant held its lock: "old" (all of it before
// the kill), "new" (taken after it), or "across". Nothing succeeds in the
// first 50 ms after the kill (a failover takes seconds); the margin keeps a
// call that raced the kill from counting as "new".
func (g grant) epoch(kill time.Time) string {
	switch {
	case g.holdEnd().Before(kill):
		return "old"
	case g.acqStart.After(kill.Add(50 * time.Millisecond)):
		return "new"
	}
	return "across"
}

// overlap reports whether a and b surely held one lock at the same time.
func overlap(a, b grant) bool {
	return a.name == b.name && a.acqEnd.Before(b.holdEnd()) && b.acqEnd.Before(a.holdEnd())
}

// A call is one successful Allow, timed on the client's monotonic clock.
type call struct{ start, end time.Time }

// failoverRun records what the callers of TestFailoverLocksAndAllow saw.
type failoverRun struct {
	mu     sync.Mutex
	errs   map[string]int // by operation and kind
	grants []grant
	allows []call
}

// fail counts an error of op by kind.
func (r *failoverRun) fail(op string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs[op+": "+errKind(err)]++
}

func (r *failoverRun) addGrant(g grant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.grants = append(r.grants, g)
}

func (r *failoverRun) addAllow(c call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.allows = append(r.allows, c)
}

// firstAfter returns how long after kill the first call that started after
// it ended, or -1 if none did.
func firstAfter(kill time.Time, calls []call) time.Duration {
	first := time.Duration(-1)
	for _, c := range calls {
		if c.start.After(kill) && (first < 0 || c.end.Sub(kill) < first) {
			first = c.end.Sub(kill)
		}
	}
	return first
}

// errKind names the kind of a caller's error.
func errKind(err error) string {
	for _, k := range []struct {
		target error
		kind   string
	}{{mutex.ErrNotObtained, "lock not obtained"}, {context.DeadlineExceeded, "deadline exceeded"}, {mutex.ErrNotHeld, "not held"}} {
		if errors.Is(err, k.target) {
			return k.kind
		}
	}
	msg := err.Error()
	for _, k := range []string{"connection refused", "connection reset", "broken pipe", "EOF", "i/o timeout",
		"READONLY", "LOADING", "MASTERDOWN", "sentinels", "use of closed network connection"} {
		if strings.Contains(msg, k) {
			return k
		}
	}
	return msg
}

// commitFragment appends ARGV[1] to the list KEYS[1]: the write a holder
// commits with UnlockWith.
var commitFragment = mutex.NewFragment(`redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], 600000)
return 1`)

// commit appends g's token to the log of g's name and releases lk, retrying
// Redis errors (after which the outcome is unknown) until a definite answer
// or until ctx ends.
func commit(ctx context.Context, r *failoverRun, l *mutex.Locker, lk *mutex.Lock, g *grant) {
	g.relStart = time.Now()
	log, err := l.Key(g.name, "log")
	if err != nil {
		panic(err) // "log" is no kind of the Locker's
	}
	c := mutex.Call{Fragment: commitFragment, Keys: []string{log}, Args: []any{g.token}}
	for i := 0; ; i++ {
		_, err := lk.UnlockWith(ctx, c)
		switch {
		case err == nil:
			g.committed = true
		case errors.Is(err, mutex.ErrNotHeld):
			g.firstNotHeld = i == 0
		default:
			r.fail("commit", err)
			if ctx.Err() == nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
		}
		g.relEnd = time.Now()
		return
	}
}

// Goroutines of two application servers lock and commit (UnlockWith) and
// call Allow through failover clients while the master is killed (SIGKILL)
// and the sentinels promote the replica.
//
// Measured and logged: the time from the kill to the first acquire and the
// first Allow that succeed, the errors callers saw, acknowledged commits lost
// with the old master, and double grants (two holders of one lock at once,
// on the client's monotonic clock), which asynchronous replication makes
// possible across a failover.
//
// Asserted: both kinds of callers work again after the failover; a lock the
// replica acknowledged (WAIT) survives the failover and its holder's commit
// lands; a lock the replica never saw (DetachReplicas) is free on the new
// master and its holder's commit is refused with ErrNotHeld; no log entry
// comes from a holder told ErrNotHeld, nor from one that committed while
// another surely held the lock on the same master; and on one master there
// is no double grant.
func TestFailoverLocksAndAllow(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a master and waits for the failover: seconds")
	}
	g := testutil.StartSentinel(t)
	// A bound against a hang: the failover alone may take up to the 20 s
	// KillMaster waits on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := g.Prefix(t)
	newClient := func() *redis.Client {
		return g.ClientOpts(t, &redis.FailoverOptions{DialTimeout: 300 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second})
	}
	c1, c2 := newClient(), newClient() // two application servers
	lockers := []*mutex.Locker{
		mustLocker(t, c1, mutex.WithPrefix(prefix), mutex.WithRetryInterval(10*time.Millisecond)),
		mustLocker(t, c2, mutex.WithPrefix(prefix), mutex.WithRetryInterval(10*time.Millisecond)),
	}
	run := &failoverRun{errs: map[string]int{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	names := []string{"n{0}", "n{1}"}
	for i := range 4 {
		l, name := lockers[i%2], names[i/2]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				gr := grant{name: name, lease: failoverLease, acqStart: time.Now()}
				lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
				lk, err := l.Lock(lctx, name, mutex.WithTTL(failoverLease))
				lcancel()
				if err != nil {
					run.fail("lock", err)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				gr.acqEnd, gr.token = time.Now(), lk.Token()
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				commit(ctx, run, l, lk, &gr)
				run.addGrant(gr)
			}
		})
	}
	rule := funnel.Rule{Name: "loose", Capacity: 1 << 30, Leak: 1 << 30, Per: time.Second}
	for i, c := range []*redis.Client{c1, c2} {
		lim := mustLimiter(t, c, funnel.WithPrefix(prefix))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				actx, acancel := context.WithTimeout(ctx, 2*time.Second)
				res, err := lim.Allow(actx, fmt.Sprintf("f{%d}", i), rule)
				acancel()
				switch {
				case err != nil:
					run.fail("allow", err)
					time.Sleep(10 * time.Millisecond)
					continue
				case !res.Allowed:
					t.Errorf("Allow under a loose rule = %+v, want allowed", res)
				}
				run.addAllow(call{start, time.Now()})
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // steady state before the kill

	// Two holders keep their locks across the kill: the replica has
	// acknowledged the first; the second is taken after the replica was cut
	// off, so it exists on the old master only.
	type staleHolder struct {
		l     *mutex.Locker
		lk    *mutex.Lock
		g     grant
		acked bool
	}
	// Their lease must outlast the failover and the checks after it, however
	// long a loaded machine takes: the kept lock is looked for on the new
	// master.
	const staleLease = time.Minute
	take := func(name string, l *mutex.Locker) *staleHolder {
		start := time.Now()
		lk, err := l.Lock(ctx, name, mutex.WithTTL(staleLease))
		if err != nil {
			t.Fatalf("stale holder of %q: %v", name, err)
		}
		return &staleHolder{l: l, lk: lk, g: grant{name: name, token: lk.Token(), acqStart: start, acqEnd: time.Now(), lease: staleLease}}
	}
	kept := take("kept", lockers[0])
	if n, err := g.Master(t).Client(t).Wait(ctx, 1, 5000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 after taking the kept lock = %d, %v", n, err)
	}
	kept.acked = true
	g.DetachReplicas(t)
	lost := take("lost", lockers[1])

	newAddr, took := g.KillMaster(t)
	kill := time.Now().Add(-took)
	// The holders' clients reach the new master first: a commit sent while
	// a client still dials the dead one fails with "connection refused",
	// which says nothing of the lock (on a loaded machine the sentinels'
	// news comes late), and the lost lock's commit must be refused at once.
	for _, c := range []*redis.Client{c1, c2} {
		for c.Ping(ctx).Err() != nil && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}

	// After the failover, another application server tries each stale lock:
	// it gets it exactly when the lock did not reach the new master.
	other := mustLocker(t, newClient(), mutex.WithPrefix(prefix))
	for _, h := range []*staleHolder{kept, lost} {
		var taken *mutex.Lock
		var err error
		var acq grant
		for {
			acq = grant{name: h.g.name, lease: failoverLease, acqStart: time.Now()}
			taken, err = other.TryLock(ctx, h.g.name, mutex.WithTTL(failoverLease))
			acq.acqEnd = time.Now()
			if err == nil || errors.Is(err, mutex.ErrLocked) || ctx.Err() != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		heldOnNew := errors.Is(err, mutex.ErrLocked)
		if !heldOnNew && err != nil {
			t.Fatalf("TryLock(%q) after the failover: %v", h.g.name, err)
		}
		if got, want := heldOnNew, h.acked; got != want {
			t.Errorf("lock %q, acknowledged by the replica: %v; held on the new master: %v", h.g.name, want, got)
		}
		commit(ctx, run, h.l, h.lk, &h.g)
		switch {
		case heldOnNew && !h.g.committed:
			t.Errorf("holder of %q, whose lock survived the failover, could not commit", h.g.name)
		case !heldOnNew && (h.g.committed || !h.g.firstNotHeld):
			t.Errorf("holder of %q, whose lock was lost in the failover: committed %v, want ErrNotHeld at once", h.g.name, h.g.committed)
		}
		t.Logf("stale holder of %q: lock on the new master %v, commit landed %v", h.g.name, heldOnNew, h.g.committed)
		run.addGrant(h.g)
		if taken != nil {
			acq.token = taken.Token()
			commit(ctx, run, other, taken, &acq)
			run.addGrant(acq)
		}
	}

	// Both kinds of callers work again, within a bound.
	lockCalls := func() []call {
		run.mu.Lock()
		defer run.mu.Unlock()
		var cs []call
		for _, gr := range run.grants {
			cs = append(cs, call{gr.acqStart, gr.acqEnd})
		}
		return cs
	}
	allowCalls := func() []call {
		run.mu.Lock()
		defer run.mu.Unlock()
		return slices.Clone(run.allows)
	}
	deadline := time.Now().Add(30 * time.Second) // a hang bound; the time is a figure
	for firstAfter(kill, lockCalls()) < 0 || firstAfter(kill, allowCalls()) < 0 {
		if time.Now().After(deadline) {
			t.Errorf("30 s after the failover, callers still fail: first acquire %v, first Allow %v (-1: none)",
				firstAfter(kill, lockCalls()), firstAfter(kill, allowCalls()))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()

	// The logs as the new master kept them: every entry comes from a holder
	// that committed or may have (an error left the outcome unknown), never
	// from one told ErrNotHeld at once.
	byToken := map[string]grant{}
	for _, gr := range run.grants {
		byToken[gr.token] = gr
	}
	entries, lostCommits := 0, 0
	for _, name := range append(names, "kept", "lost") {
		log, err := c1.LRange(ctx, mustKey(t, lockers[0], name, "log"), 0, -1).Result()
		if err != nil {
			t.Fatalf("LRANGE log of %q: %v", name, err)
		}
		entries += len(log)
		present := map[string]bool{}
		for _, tok := range log {
			present[tok] = true
			switch gr, ok := byToken[tok]; {
			case !ok:
				t.Errorf("log of %q holds %q, which no holder wrote", name, tok)
			case gr.firstNotHeld:
				t.Errorf("log of %q holds the write of %s, whose UnlockWith said ErrNotHeld", name, tok)
			}
		}
		for _, gr := range run.grants {
			if gr.name == name && gr.committed && !present[gr.token] {
				lostCommits++
			}
		}
	}
	// Double grants, and commits that landed while another holder surely
	// held the lock on the same master: writes from a holder whose lock was
	// gone.
	doubles := 0
	for i, a := range run.grants {
		for _, b := range run.grants[i+1:] {
			if !overlap(a, b) {
				continue
			}
			doubles++
			if ea, eb := a.epoch(kill), b.epoch(kill); ea == eb && ea != "across" {
				t.Errorf("double grant of %q on one master (%s): %+v and %+v", a.name, ea, a, b)
			}
		}
		if !a.committed {
			continue
		}
		for _, b := range run.grants {
			if b.token == a.token || b.name != a.name || !b.acqEnd.Before(a.relStart) || !a.relEnd.Before(b.holdEnd()) {
				continue
			}
			if eb := b.epoch(kill); eb == "new" || (eb == "old" && a.relEnd.Before(kill)) {
				t.Errorf("commit of %s on %q landed while %s held the lock", a.token, a.name, b.token)
			}
		}
	}

	kinds := make([]string, 0, len(run.errs))
	total := 0
	for k, n := range run.errs {
		kinds = append(kinds, fmt.Sprintf("%s ×%d", k, n))
		total += n
	}
	slices.Sort(kinds)
	t.Logf("sentinel failover to %s: %v after the kill", newAddr, took)
	t.Logf("first acquire started after the kill succeeded %v after it; first Allow %v", firstAfter(kill, lockCalls()), firstAfter(kill, allowCalls()))
	t.Logf("%d grants, %d Allows; %d commits on the new master, %d acknowledged commits lost with the old master", len(run.grants), len(run.allows), entries, lostCommits)
	t.Logf("double grants: %d", doubles)
	t.Logf("%d errors seen by callers: %s", total, strings.Join(kinds, "; "))
}
