package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/funnelguard/funnelguard/internal/testmust"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// The waiting path's linearizability check: its size, its clients and
// how many acquisitions each makes.
const (
	semWaitSize    = 4
	semWaitLockers = 3
	semWaitClients = 16
	semWaitRounds  = 5
	// semWaitEpisodes: the clients run this many times, each time on a
	// semaphore of its own, checked on its own (porcupine's search grows
	// fast with the length of a history whose operations overlap).
	semWaitEpisodes = 8
	// semWaitUnknowns: episodes whose check may end with no verdict (out
	// of time), each replaced by a fresh one; one more fails the test.
	semWaitUnknowns = 2
)

// TestSemaphoreWaitLinearizable: 16 goroutines on 3 Lockers (each with
// its own connections and Pub/Sub) take weighted permits (1 to 4 of 4)
// with TryAcquire, with Acquire that waits until a release grants it (woken
// by Pub/Sub), and with Acquire whose context ends within a few
// milliseconds (often while queued, sometimes as a grant races it), then
// Extend and Release them. The history must be that of one semaphore with
// a FIFO queue taking the operations one at a time (semWaitModel): never
// more than 4 permits held, a TryAcquire refused only when its permits do
// not fit or someone waits, a release granting the head waiters in order as
// far as they fit, a cancelled Acquire holding nothing.
//
// An Acquire is two operations: its enqueue, within the interval from the
// send of its first script to that script's reply (a go-redis hook,
// semTrace, times them), and then either its grant, observed just before
// Acquire returned, or its cancel, between the send of its cancel script
// and the last reply of its scripts (the cancel may run after Acquire
// returned, cancelWait).
func TestSemaphoreWaitLinearizable(t *testing.T) {
	b := testutil.RealBackend(t)
	trace := newSemTrace()
	var lockers []*mutex.Locker
	for range semWaitLockers {
		c := b.Client(t)
		c.AddHook(trace)
		// A retry interval of 3 s gives waiters a wait lease of 9 s, 3 s
		// more than the longest pause between their polls: none is passed
		// over for polling late on a loaded machine (the model has no
		// wait leases).
		l := mustLocker(t, c, mutex.WithPrefix(b.Prefix), mutex.WithRetryInterval(3*time.Second))
		lockers = append(lockers, l)
		semWarmUp(t, testmust.Semaphore(t, l, "waitlin-warm", semWaitSize))
	}
	start := time.Now()
	trace.begin(start)
	var total [3]int
	ops := 0
	unknown := 0
	for e := 0; e < semWaitEpisodes+unknown; e++ {
		var sems []*mutex.Semaphore
		for _, l := range lockers {
			sems = append(sems, testmust.Semaphore(t, l, fmt.Sprint("waitlin-", e), semWaitSize))
		}
		run := &semWaitRun{start: start, ids: e * 1000}
		history := run.episode(t, sems, trace)
		res, info := porcupine.CheckOperationsVerbose(semWaitModel(semWaitSize), history, time.Minute)
		switch {
		case res == porcupine.Unknown && unknown < semWaitUnknowns:
			// The check's search ran out of time, which a loaded machine
			// causes (slow calls overlap more of the others): no verdict,
			// so a fresh episode takes its place. An illegal history
			// fails at once.
			unknown++
			t.Logf("episode %d, %d operations: the check found no verdict in a minute; another episode instead", e, len(history))
			continue
		case res != porcupine.Ok:
			semWaitDump(t, info, semWaitModel(semWaitSize))
			t.Fatalf("episode %d, %d operations: not linearizable (%v)", e, len(history), res)
		}
		ops += len(history)
		for i := range total {
			total[i] += run.counts[i]
		}
	}
	_, gaveBack := trace.settle(t)
	t.Logf("%d operations in %d episodes linearizable: %d waits granted, %d cancelled (%d gave back a grant that raced the cancel), %d TryAcquire",
		ops, semWaitEpisodes, total[0], total[1], gaveBack, total[2])
	if total[0] == 0 || total[1] == 0 {
		t.Fatalf("granted waits %d, cancelled %d: the run did not exercise the waiting path", total[0], total[1])
	}
}

// episode runs the clients on sems (one per Locker) until each made its
// acquisitions, then takes and releases every permit, and returns the
// history once every command has replied: the next episode starts afresh.
func (r *semWaitRun) episode(t *testing.T, sems []*mutex.Semaphore, trace *semTrace) []porcupine.Operation {
	errs := make(chan error, semWaitClients)
	var wg sync.WaitGroup
	for c := range semWaitClients {
		wg.Go(func() { errs <- r.client(sems[c%len(sems)], c) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	trace.settle(t) // every cancel has run
	// Nothing is held or queued now: a TryAcquire of every permit must be
	// granted. Permits kept by nobody (a cancel that did not give back a
	// grant that raced it) make it refused, which the model rejects.
	p, err := r.try(sems[0], semWaitClients, r.nextID(), semWaitSize)
	if err != nil {
		t.Fatal(err)
	}
	if p != nil {
		call := r.now()
		err := p.Release(context.Background())
		r.record(semWaitClients, semWaitIn{kind: swRelease, id: r.ids, n: semWaitSize}, call, err == nil)
	}
	traced, _ := trace.settle(t)
	return r.history(traced)
}

// semWarmUp takes and releases permits of s from a few goroutines at once,
// so that the check does not begin with the connections' dials and the
// scripts' first loads: calls that slow overlap all the others, and a
// check of operations that all overlap takes long.
func semWarmUp(t *testing.T, s *mutex.Semaphore) {
	var wg sync.WaitGroup
	for range semWaitSize {
		wg.Go(func() {
			ctx := context.Background()
			for range 3 {
				p, err := s.Acquire(ctx, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if err := p.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
}

// semWaitDump writes porcupine's visualization of a failed check to a
// file that outlives the test, and names it.
func semWaitDump(t *testing.T, info porcupine.LinearizationInfo, model porcupine.Model) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("funnelguard-semaphore-waitlin-%d.html", time.Now().UnixNano()))
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		t.Logf("no visualization: %v", err)
		return
	}
	t.Logf("visualization of the longest linearizable prefixes: %s", path)
}

// semWaitRun records the operations of the check's clients.
type semWaitRun struct {
	start time.Time

	mu      sync.Mutex
	ids     int
	ops     []porcupine.Operation
	pending []semPending
	counts  [3]int // waits granted, waits cancelled, TryAcquires
}

// semPending is an Acquire whose enqueue (and cancel) intervals wait for
// the trace of its scripts.
type semPending struct {
	client    int
	in        semWaitIn
	call, ret int64
	granted   bool
}

func (r *semWaitRun) now() int64 { return int64(time.Since(r.start)) }

func (r *semWaitRun) record(client int, in semWaitIn, call int64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: ok, Return: r.now()})
}

func (r *semWaitRun) nextID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids++
	return r.ids
}

// client makes semWaitRounds acquisitions of random weight, each held for
// up to a millisecond, sometimes extended, and released.
func (r *semWaitRun) client(s *mutex.Semaphore, c int) error {
	ctx := context.Background()
	for range semWaitRounds {
		id, n := r.nextID(), 1+rand.Int64N(semWaitSize)
		var p *mutex.Permit
		var err error
		switch k := rand.IntN(10); {
		case k < 3:
			p, err = r.try(s, c, id, n)
		case k < 7:
			p, err = r.acquire(s, c, id, n, 30*time.Second)
		default:
			p, err = r.acquire(s, c, id, n, time.Duration(rand.IntN(4000))*time.Microsecond)
		}
		if err != nil {
			return err
		}
		if p == nil {
			continue
		}
		time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
		if rand.IntN(3) == 0 {
			call := r.now()
			err := p.Extend(ctx, semWaitLeaseBase)
			if err != nil && !errors.Is(err, mutex.ErrNotHeld) {
				return err
			}
			r.record(c, semWaitIn{kind: swExtend, id: id, n: n}, call, err == nil)
		}
		call := r.now()
		err = p.Release(ctx)
		if err != nil && !errors.Is(err, mutex.ErrNotHeld) {
			return err
		}
		r.record(c, semWaitIn{kind: swRelease, id: id, n: n}, call, err == nil)
	}
	return nil
}

// try is one TryAcquire; a nil Permit and error mean it was refused.
func (r *semWaitRun) try(s *mutex.Semaphore, c, id int, n int64) (*mutex.Permit, error) {
	call := r.now()
	p, err := s.TryAcquire(context.Background(), n, mutex.WithTTL(semWaitLeaseBase))
	if err != nil && !errors.Is(err, mutex.ErrNoPermits) {
		return nil, err
	}
	r.record(c, semWaitIn{kind: swTry, id: id, n: n}, call, err == nil)
	r.mu.Lock()
	r.counts[2]++
	r.mu.Unlock()
	return p, nil
}

// acquire is one Acquire whose context ends after wait; a nil Permit and
// error mean it was cancelled.
func (r *semWaitRun) acquire(s *mutex.Semaphore, c, id int, n int64, wait time.Duration) (*mutex.Permit, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	call := r.now()
	p, err := s.Acquire(ctx, n, mutex.WithTTL(semWaitLeaseBase+time.Duration(id)*time.Millisecond))
	ret := r.now()
	cancelled := err != nil && errors.Is(err, mutex.ErrNotObtained) && ctx.Err() != nil
	if err != nil && !cancelled {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = append(r.pending, semPending{client: c, in: semWaitIn{id: id, n: n}, call: call, ret: ret, granted: err == nil})
	if err == nil {
		r.counts[0]++
	} else {
		r.counts[1]++
	}
	return p, nil
}

// history returns the recorded operations with each Acquire's as traced.
// An Acquire that sent no script did nothing, and is left out.
func (r *semWaitRun) history(traced map[int]semTraced) []porcupine.Operation {
	ops := append([]porcupine.Operation(nil), r.ops...)
	for _, a := range r.pending {
		tr, ok := traced[a.in.id]
		if !ok {
			continue
		}
		end := max(a.ret, tr.last)
		enq := end
		if tr.firstOK != 0 {
			enq = tr.firstOK
		}
		in := a.in
		in.kind, in.seq = swEnqueue, tr.seq
		ops = append(ops, porcupine.Operation{ClientId: a.client, Input: in, Call: tr.sent, Output: true, Return: enq})
		in.seq = 0
		if a.granted {
			// Granted before Acquire returned, it holds until its own
			// Release (leases of a minute do not end here): the instant
			// before the return is a point where it surely holds. An
			// interval from the call on would leave porcupine every place
			// in the wait to try.
			in.kind = swGranted
			ops = append(ops, porcupine.Operation{ClientId: a.client, Input: in, Call: a.ret - 1, Output: true, Return: a.ret})
			continue
		}
		// The cancel takes effect in its script; before it the waiter
		// stays queued (or holds a grant that raced the cancel).
		in.kind = swCancel
		call := a.call
		if tr.cancel != 0 {
			call = tr.cancel
		}
		ops = append(ops, porcupine.Operation{ClientId: a.client, Input: in, Call: call, Output: true, Return: end})
	}
	return ops
}
