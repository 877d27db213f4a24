package reliability

// Linearizability of one lock handle's methods racing each other (issue 28,
// DESIGN.md principle 9), checked with porcupine on histories recorded
// against a real server: each round, several goroutines race Unlock,
// UnlockWith, Extend and Run on one handle of Locker A, while a goroutine of
// A waits in Lock for the name (a release hands it the lock: without a round
// trip, keeping the token, or through Redis with a fresh one) and a
// goroutine of Locker B, on a client of its own, contends with TryLock and
// Lock.
//
// The model (hlModel) is one lock and one counter per name, and which
// handle holds the lock; a handle is an acquisition as the caller sees it,
// not a token (a local hand-over passes the token on). The counter is INCRed
// by the raced handle's Run and UnlockWith, only while it holds the lock, and
// read by every other holder in its acquire, under its lock and in its
// release, atomically with each; so an INCR that lands under another
// holder's lock is a read that changed under that holder, which no order of
// the operations explains. linLockModel and linCounterModel (linearize_test.go)
// model tokens with leases and unknown outcomes, and the counter apart from
// the lock; here every outcome is definite (a clean server, long leases) and
// the question is who may act, so the holder and the counter are one state.
//
// A release is decided in two steps: the winner's move from held to
// releasing, made at once by the one atomic transition, then its effect in
// Redis or on a waiter, a round trip later. Between them the other calls on
// the handle get ErrNotHeld although Redis still has the lock under the
// handle's token, and a Run that was already on its way may still write
// under it. So the model records a successful Unlock or UnlockWith as two
// operations on its interval: hlBegin (held -> releasing, which only one call
// can make) and the release itself (releasing -> free), and lets ErrNotHeld
// answer a call on a handle that does not hold the lock or is being
// released.
//
// Times are this process's monotonic clock (as in linearize_test.go). Each
// round is a name of its own and a history of its own, checked as soon as it
// ends: about 10 to 25 operations, checked in a millisecond at most, so a
// porcupine timeout cannot make the test flaky under load. Nothing is timed:
// sleeps and hlDelay only vary the interleavings.
//
// The test can fail: with the transition made non-atomic (beginRelease not
// moving the handle to releasing, so two Unlocks both release), or with a
// local hand-over allowed while an Extend or Run is in flight (passOn without
// its busy test, so a Run writes under the waiter's lock), it failed in 10 of
// 10 runs each, by round 58 and by round 162 (issue 28; RELIABILITY.md);
// TestHandleModelCanFail shows the model rejects those histories.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

const (
	// hlLease is every lease of the run: no lock expires within a round,
	// however loaded the machine. Extend sets it again, so the lease a
	// holder surely has stays long enough for a local hand-over.
	hlLease = 30 * time.Second
	// hlRoundTimeout bounds every call of a round.
	hlRoundTimeout = 30 * time.Second
	// hlDefaultRounds is the rounds of a normal run (about 6 s with -race on
	// 2 idle cores); FUNNELGUARD_RACE_ROUNDS sets another number (the issue's
	// 10,000 for a long run).
	hlDefaultRounds = 600
	// hlMark is an argument of the raced handle's Run and UnlockWith calls,
	// which their fragment ignores: hlDelay delays the commands that carry it.
	hlMark = "hl-racer"
)

// ---- the model ----

type hlOp uint8

const (
	hlAcquire    hlOp = iota // Lock, TryLock, LockWith, TryLockWith; failed: ErrLocked
	hlBegin                  // a successful release's move to releasing
	hlUnlock                 // Unlock; failed: ErrNotHeld
	hlUnlockIncr             // UnlockWith(INCR counter)
	hlUnlockRead             // UnlockWith(GET counter)
	hlExtend                 // Extend
	hlRunIncr                // Run(INCR counter)
	hlRunRead                // Run(GET counter)
)

var hlOpNames = [...]string{"acquire", "begin-release", "Unlock", "UnlockWith(INCR)", "UnlockWith(GET)", "Extend", "Run(INCR)", "Run(GET)"}

// hlInput is one call of handle (1: the raced handle of A, 2: A's waiter, 3:
// B). read marks an acquire whose script read the counter (the With forms).
type hlInput struct {
	op     hlOp
	handle int
	read   bool
}

// hlOutput is a call's outcome, linOK or linFailed (ErrLocked for an acquire,
// ErrNotHeld otherwise), with the counter it read or its value after its
// INCR.
type hlOutput struct {
	out linOutcome
	v   int64
}

// hlState is who holds the lock (0: nobody), whether that handle is being
// released, and the counter.
type hlState struct {
	holder    int
	releasing bool
	n         int64
}

func (o hlOp) reads() bool { return o == hlUnlockRead || o == hlRunRead }
func (o hlOp) incrs() bool { return o == hlUnlockIncr || o == hlRunIncr }

// hlStep is the model's step: whether a call could return out in state s, and
// the state after it.
func hlStep(state, input, output any) (bool, any) {
	s, in, o := state.(hlState), input.(hlInput), output.(hlOutput)
	mine := s.holder == in.handle
	// The counter as the call saw it: what it read, or its INCR's result.
	counted := (!in.op.reads() || o.v == s.n) && (!in.op.incrs() || o.v == s.n+1)
	after := s
	if in.op.incrs() {
		after.n = o.v
	}
	switch {
	case in.op == hlAcquire && o.out == linOK:
		return s.holder == 0 && (!in.read || o.v == s.n), hlState{holder: in.handle, n: s.n}
	case in.op == hlAcquire: // ErrLocked, with what the attempt read
		return s.holder != 0 && (!in.read || o.v == s.n), s
	case o.out == linFailed: // ErrNotHeld: not its lock, or being released
		return !mine || s.releasing, s
	case in.op == hlBegin:
		return mine && !s.releasing, hlState{holder: s.holder, releasing: true, n: s.n}
	case in.op == hlUnlock, in.op == hlUnlockIncr, in.op == hlUnlockRead:
		return mine && s.releasing && counted, hlState{n: after.n}
	default: // Extend, Run: an ok needs the lock, being released or not (a call in flight)
		return mine && counted, after
	}
}

var hlModel = porcupine.Model{
	Init: func() any { return hlState{} },
	Step: hlStep,
	Hash: func(state any) uint64 {
		s := state.(hlState)
		r := int64(0)
		if s.releasing {
			r = 1
		}
		return linHash(int64(s.holder), r, s.n)
	},
	DescribeOperation: func(input, output any) string {
		in, o := input.(hlInput), output.(hlOutput)
		who := [...]string{"?", "A", "W", "B"}[min(in.handle, 3)]
		verb := hlOpNames[in.op]
		if in.op == hlAcquire && in.read {
			verb = "acquire+GET"
		}
		if in.read || in.op.reads() || in.op.incrs() {
			return fmt.Sprintf("%s %s -> %v, %d", who, verb, o.out, o.v)
		}
		return fmt.Sprintf("%s %s -> %v", who, verb, o.out)
	},
	DescribeState: func(state any) string {
		s := state.(hlState)
		holder := [...]string{"free", "A", "W", "B"}[min(s.holder, 3)]
		if s.releasing {
			holder += " (releasing)"
		}
		return fmt.Sprintf("%s, counter %d", holder, s.n)
	},
}

// ---- recording ----

// hlRecorder collects the history of one round.
type hlRecorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	errs  []error // calls that failed with an error other than the definite ones
}

func (r *hlRecorder) now() int64 { return int64(time.Since(r.start)) }

func (r *hlRecorder) add(client int, in hlInput, call, ret int64, out linOutcome, v int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: hlOutput{out, v}, Return: ret})
}

// record records a call made at call that returned res, err now; definite is
// its definite failure (ErrLocked, ErrNotHeld). Any other error is kept for
// the test to report and the call is not recorded: on a clean server with
// long deadlines no call has an unknown outcome. It reports whether the call
// succeeded.
func (r *hlRecorder) record(client int, in hlInput, call int64, res any, err, definite error) bool {
	ret := r.now()
	v, verr := hlInt(res)
	out := linOK
	switch {
	case err == nil && verr != nil:
		err = verr
	case err != nil && errors.Is(err, definite):
		out = linFailed
	}
	if err != nil && out != linFailed {
		r.mu.Lock()
		r.errs = append(r.errs, fmt.Errorf("%s of handle %d: %w", hlOpNames[in.op], in.handle, err))
		r.mu.Unlock()
		return false
	}
	if out == linOK && (in.op == hlUnlock || in.op == hlUnlockIncr || in.op == hlUnlockRead) {
		r.add(client, hlInput{op: hlBegin, handle: in.handle}, call, ret, linOK, 0)
	}
	r.add(client, in, call, ret, out, v)
	return out == linOK
}

// hlInt reads a fragment's result: an INCR's integer, or a GET's string (nil
// for a counter not yet written).
func hlInt(res any) (int64, error) {
	switch x := res.(type) {
	case nil:
		return 0, nil
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("fragment result %#v", res)
}

var hlIncr = mutex.NewFragment(`return redis.call('INCR', KEYS[1])`)

// hlDelay delays the commands of the raced handle's Run and UnlockWith calls
// (those with the argument hlMark) by up to 1 ms before they are sent, as a
// network might: such a call is then often still on its way while another
// call releases the handle, which is when a hand-over without a round trip
// could let it act for the waiter's lock.
type hlDelay struct{}

func (hlDelay) DialHook(next redis.DialHook) redis.DialHook { return next }

func (hlDelay) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		hlPause(cmd)
		return next(ctx, cmd)
	}
}

func (hlDelay) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		hlPause(cmds...)
		return next(ctx, cmds)
	}
}

func hlPause(cmds ...redis.Cmder) {
	for _, cmd := range cmds {
		if slices.Contains(cmd.Args(), any(hlMark)) {
			time.Sleep(rand.N(time.Millisecond))
			return
		}
	}
}

// hlRounds is how many rounds TestHandleLinearizable runs.
func hlRounds(t *testing.T) int {
	if s := os.Getenv("FUNNELGUARD_RACE_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("FUNNELGUARD_RACE_ROUNDS=%q: want a positive integer", s)
		}
		return n
	}
	return hlDefaultRounds
}

// hlStats counts what the rounds exercised.
type hlStats struct {
	ops, racers, localHandOvers, redisHandOvers int
	byOutcome                                   map[string]int
}

// TestHandleLinearizable races the methods of one handle of Locker A (2 to 6
// goroutines, each calling one of Unlock, UnlockWith(INCR), Extend and
// Run(INCR), started together), a goroutine of A queued in Lock for the
// name (once it has the lock: Run(GET), then UnlockWith(GET)), and a
// goroutine of Locker B on another client (up to 3 TryLocks or TryLockWith
// (GET), then Lock or LockWith(GET), then UnlockWith(GET)), and checks each
// round's history with porcupine against hlModel. The test's goroutine takes
// the lock first and, once the racers are done, unlocks the handle once
// more: ErrNotHeld if a racer released it, else the release that ends the
// round. FUNNELGUARD_RACE_ROUNDS sets the number of rounds (600 by default).
func TestHandleLinearizable(t *testing.T) {
	b := testutil.RealBackend(t)
	opts := []mutex.Option{mutex.WithPrefix(b.Prefix), mutex.WithTTL(hlLease), mutex.WithRetryInterval(time.Millisecond)}
	ca := b.ClientOpts(t, &redis.Options{ContextTimeoutEnabled: true})
	ca.AddHook(hlDelay{})
	a := mustLocker(t, ca, opts...)
	other := mustLocker(t, b.ClientOpts(t, &redis.Options{ContextTimeoutEnabled: true}), opts...)
	plain := b.Client(t)

	rounds := hlRounds(t)
	seed := uint64(time.Now().UnixNano())
	st := hlStats{byOutcome: map[string]int{}}
	start := time.Now()
	for round := range rounds {
		name := fmt.Sprintf("hl-%d", round)
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		rec, local := hlRound(t, a, other, name, rng)
		plain.Del(context.Background(), mustKey(t, a, name, "data"))
		res := porcupine.CheckOperationsTimeout(hlModel, rec.ops, linCheckTimeout)
		if res != porcupine.Ok {
			t.Logf("round %d (seed %d), history by call time:\n%s", round, seed, hlDescribe(rec.ops))
			linCheck(t, fmt.Sprintf("handles-round-%d", round), hlModel, rec.ops)
		}
		if err := errors.Join(rec.errs...); err != nil {
			t.Fatalf("round %d: calls failed with errors other than ErrNotHeld and ErrLocked:\n%v", round, err)
		}
		st.count(rec.ops, local)
	}
	t.Logf("%d rounds in %v (seed %d): %d operations checked; %d racers; waiter handed the lock without a round trip %d times, through Redis %d times; outcomes: %v",
		rounds, time.Since(start).Round(time.Millisecond), seed, st.ops, st.racers, st.localHandOvers, st.redisHandOvers, st.byOutcome)
	if rounds >= 100 && (st.localHandOvers == 0 || st.redisHandOvers == 0 || st.byOutcome["A Run(INCR) ok"] == 0 ||
		st.byOutcome["A Run(INCR) failed"] == 0 || st.byOutcome["B acquire failed"] == 0) {
		t.Fatalf("the rounds missed a case they are meant to race (both kinds of hand-over, Run ok and ErrNotHeld, B refused)")
	}
}

func (st *hlStats) count(ops []porcupine.Operation, local bool) {
	st.ops += len(ops)
	if local {
		st.localHandOvers++
	} else {
		st.redisHandOvers++
	}
	for _, op := range ops {
		in, o := op.Input.(hlInput), op.Output.(hlOutput)
		if in.op == hlBegin {
			continue
		}
		who := [...]string{"?", "A", "W", "B"}[min(in.handle, 3)]
		st.byOutcome[fmt.Sprintf("%s %s %v", who, hlOpNames[in.op], o.out)]++
		if op.ClientId >= hlFirstRacer {
			st.racers++
		}
	}
}

// Porcupine client ids: the test's goroutine, A's waiter, B, then the racers.
const (
	hlMain = iota
	hlWaiter
	hlOther
	hlFirstRacer
)

// hlRound runs one round on name and returns its history, and whether the
// waiter got the raced handle's token (a hand-over without a round trip).
func hlRound(t *testing.T, a, other *mutex.Locker, name string, rng *rand.Rand) (*hlRecorder, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), hlRoundTimeout)
	defer cancel()
	data := mustKey(t, a, name, "data")
	incr := mutex.Call{Fragment: hlIncr, Keys: []string{data}, Args: []any{hlMark}}
	read := mutex.Call{Fragment: linReadCounter, Keys: []string{data}}
	rec := &hlRecorder{start: time.Now()}

	call := rec.now()
	lk, err := a.Lock(ctx, name)
	if !rec.record(hlMain, hlInput{op: hlAcquire, handle: 1}, call, nil, err, mutex.ErrLocked) {
		t.Fatalf("A's first Lock of %s: %v", name, err)
	}

	// A's waiter: queued before the race starts.
	var waiter sync.WaitGroup
	token, queued := make(chan string, 1), make(chan struct{})
	waiter.Go(func() {
		defer close(queued)
		call := rec.now()
		w, err := a.Lock(ctx, name)
		if !rec.record(hlWaiter, hlInput{op: hlAcquire, handle: 2}, call, nil, err, mutex.ErrLocked) {
			token <- ""
			return
		}
		token <- w.Token()
		call = rec.now()
		res, err := w.Run(ctx, read)
		rec.record(hlWaiter, hlInput{op: hlRunRead, handle: 2}, call, res, err, mutex.ErrNotHeld)
		time.Sleep(rand.N(time.Millisecond))
		call = rec.now()
		res, err = w.UnlockWith(ctx, read)
		rec.record(hlWaiter, hlInput{op: hlUnlockRead, handle: 2}, call, res, err, mutex.ErrNotHeld)
	})
	for a.Waiters(name) == 0 {
		select {
		case <-queued: // it returned: an error, reported after the round
		case <-time.After(50 * time.Microsecond):
			continue
		}
		break
	}

	kinds := make([]hlOp, 2+rng.IntN(5))
	for i := range kinds {
		kinds[i] = [...]hlOp{hlUnlock, hlUnlockIncr, hlExtend, hlRunIncr}[rng.IntN(4)]
	}
	tries, with := rng.IntN(4), rng.IntN(2) == 0
	var racers, contender sync.WaitGroup
	var ready sync.WaitGroup
	ready.Add(1)
	for i, kind := range kinds {
		client := hlFirstRacer + i
		racers.Go(func() {
			ready.Wait()
			if rand.IntN(2) == 0 {
				time.Sleep(rand.N(300 * time.Microsecond))
			}
			in := hlInput{op: kind, handle: 1}
			call := rec.now()
			var res any
			var err error
			switch kind {
			case hlUnlock:
				err = lk.Unlock(ctx)
			case hlUnlockIncr:
				res, err = lk.UnlockWith(ctx, incr)
			case hlExtend:
				err = lk.Extend(ctx, hlLease)
			case hlRunIncr:
				res, err = lk.Run(ctx, incr)
			}
			rec.record(client, in, call, res, err, mutex.ErrNotHeld)
		})
	}
	contender.Go(func() {
		ready.Wait()
		in := hlInput{op: hlAcquire, handle: 3, read: with}
		var b *mutex.Lock
		for range tries {
			time.Sleep(rand.N(400 * time.Microsecond))
			call := rec.now()
			var res any
			var err error
			if with {
				b, res, err = other.TryLockWith(ctx, name, read)
			} else {
				b, err = other.TryLock(ctx, name)
			}
			if rec.record(hlOther, in, call, res, err, mutex.ErrLocked) {
				break
			}
			if !errors.Is(err, mutex.ErrLocked) {
				return
			}
		}
		if b == nil {
			call := rec.now()
			var res any
			var err error
			if with {
				b, res, err = other.LockWith(ctx, name, read)
			} else {
				b, err = other.Lock(ctx, name)
			}
			if !rec.record(hlOther, in, call, res, err, nil) {
				return
			}
		}
		time.Sleep(rand.N(500 * time.Microsecond))
		call := rec.now()
		res, err := b.UnlockWith(ctx, read)
		rec.record(hlOther, hlInput{op: hlUnlockRead, handle: 3}, call, res, err, mutex.ErrNotHeld)
	})
	ready.Done()
	racers.Wait()
	call = rec.now()
	err = lk.Unlock(ctx)
	rec.record(hlMain, hlInput{op: hlUnlock, handle: 1}, call, nil, err, mutex.ErrNotHeld)
	waiter.Wait()
	contender.Wait()
	return rec, <-token == lk.Token()
}

// hlDescribe lists ops by call time, for a failure's log.
func hlDescribe(ops []porcupine.Operation) string {
	ops = slices.Clone(ops)
	slices.SortStableFunc(ops, func(x, y porcupine.Operation) int { return int(x.Call - y.Call) })
	var s string
	for _, op := range ops {
		s += fmt.Sprintf("  [%9.3f, %9.3f] ms  client %d  %s\n", float64(op.Call)/1e6, float64(op.Return)/1e6,
			op.ClientId, hlModel.DescribeOperation(op.Input, op.Output))
	}
	return s
}

// TestHandleModelCanFail feeds hlModel hand-written histories of one round
// (times in ms; handle 1 is A's raced handle, 2 its waiter W, 3 B's lock):
// each broken one must be Illegal, so that the model is not vacuous, and
// each correct one Ok. The visualization of a broken history is written.
func TestHandleModelCanFail(t *testing.T) {
	ms := func(x float64) int64 { return int64(x * float64(time.Millisecond)) }
	op := func(client int, in hlInput, call, ret float64, out linOutcome, v int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Call: ms(call), Return: ms(ret), Output: hlOutput{out, v}}
	}
	// call is a call of op by handle; a successful release is recorded as
	// its begin and itself, as hlRecorder.record does.
	call := func(client int, kind hlOp, handle int, c, r float64, out linOutcome, v int64) []porcupine.Operation {
		ops := []porcupine.Operation{op(client, hlInput{op: kind, handle: handle}, c, r, out, v)}
		if out == linOK && (kind == hlUnlock || kind == hlUnlockIncr || kind == hlUnlockRead) {
			ops = append([]porcupine.Operation{op(client, hlInput{op: hlBegin, handle: handle}, c, r, linOK, 0)}, ops...)
		}
		return ops
	}
	acquire := func(client, handle int, c, r float64, out linOutcome) []porcupine.Operation {
		return call(client, hlAcquire, handle, c, r, out, 0)
	}
	acquireRead := func(c, r float64, out linOutcome, v int64) []porcupine.Operation {
		return []porcupine.Operation{op(hlOther, hlInput{op: hlAcquire, handle: 3, read: true}, c, r, out, v)}
	}
	const ok, failed = linOK, linFailed
	A, W, B := 1, 2, 3
	// A holds from 0 to 1 on; W queues at 0.5 and gets the lock when A's
	// release hands it over.
	start := slices.Concat(acquire(hlMain, A, 0, 1, ok))
	history := func(parts ...[]porcupine.Operation) []porcupine.Operation {
		return slices.Concat(append([][]porcupine.Operation{start}, parts...)...)
	}
	cases := []struct {
		name    string
		history []porcupine.Operation
		want    porcupine.CheckResult
	}{
		{"two Unlocks of one handle both ok", history(
			acquire(hlWaiter, W, 0.5, 12, ok),
			call(3, hlUnlock, A, 2, 10, ok, 0),
			call(4, hlUnlock, A, 2, 10, ok, 0),
		), porcupine.Illegal},
		{"an Unlock and an UnlockWith of one handle both ok", history(
			acquire(hlWaiter, W, 0.5, 12, ok),
			call(3, hlUnlock, A, 2, 10, ok, 0),
			call(4, hlUnlockIncr, A, 2, 10, ok, 1),
		), porcupine.Illegal},
		{"a Run ok after its handle's Unlock returned and the waiter got the lock", history(
			acquire(hlWaiter, W, 0.5, 9, ok),
			call(3, hlUnlock, A, 2, 8, ok, 0),
			call(4, hlRunIncr, A, 10, 11, ok, 1),
		), porcupine.Illegal},
		{"an INCR of the raced handle between two reads of the waiter", history(
			call(4, hlRunIncr, A, 1.5, 20, ok, 1), // on its way all along
			call(3, hlUnlock, A, 2, 3, ok, 0),
			acquire(hlWaiter, W, 0.5, 4, ok),
			call(hlWaiter, hlRunRead, W, 5, 6, ok, 0),
			call(hlWaiter, hlUnlockRead, W, 21, 22, ok, 1),
		), porcupine.Illegal},
		{"an Extend ok after the handle's release", history(
			call(3, hlUnlock, A, 2, 3, ok, 0),
			call(4, hlExtend, A, 4, 5, ok, 0),
		), porcupine.Illegal},
		{"ErrNotHeld while the handle held and nobody released it", history(
			call(4, hlExtend, A, 2, 3, failed, 0),
			call(3, hlUnlock, A, 5, 6, ok, 0),
		), porcupine.Illegal},
		{"B's lock while the waiter holds", history(
			call(3, hlUnlock, A, 2, 3, ok, 0),
			acquire(hlWaiter, W, 0.5, 4, ok),
			acquire(hlOther, B, 5, 6, ok),
			call(hlWaiter, hlUnlockRead, W, 7, 8, ok, 0),
		), porcupine.Illegal},
		{"ErrLocked to B once everyone released", history(
			call(3, hlUnlock, A, 2, 3, ok, 0),
			acquire(hlWaiter, W, 0.5, 4, ok),
			call(hlWaiter, hlUnlockRead, W, 5, 6, ok, 0),
			acquireRead(7, 8, failed, 0),
		), porcupine.Illegal},
		{"an INCR that a later holder does not see", history(
			call(3, hlUnlockIncr, A, 2, 3, ok, 1),
			acquire(hlWaiter, W, 0.5, 4, ok),
			call(hlWaiter, hlUnlockRead, W, 5, 6, ok, 0),
		), porcupine.Illegal},
		{"losers answered while the winner's release is on its way", history(
			// The winner's INCR lands at about 9; the losers got
			// ErrNotHeld by 4, and B read 0 until 8.
			call(3, hlUnlockIncr, A, 2, 10, ok, 1),
			call(4, hlUnlock, A, 3, 4, failed, 0),
			call(5, hlExtend, A, 3, 4, failed, 0),
			call(6, hlRunIncr, A, 3, 4, failed, 0),
			acquireRead(5, 8, failed, 0),
			acquire(hlWaiter, W, 0.5, 11, ok),
			call(hlWaiter, hlRunRead, W, 12, 13, ok, 1),
			call(hlWaiter, hlUnlockRead, W, 14, 15, ok, 1),
			acquireRead(16, 17, ok, 1),
			call(hlOther, hlUnlockRead, B, 18, 19, ok, 1),
		), porcupine.Ok},
		{"a Run in flight that lands before the release through Redis", history(
			call(4, hlRunIncr, A, 1.5, 6, ok, 1),
			call(5, hlExtend, A, 1.6, 7, failed, 0),
			call(3, hlUnlock, A, 2, 5, ok, 0),
			call(6, hlUnlockIncr, A, 2.5, 3, failed, 0),
			acquire(hlWaiter, W, 0.5, 5.5, ok),
			call(hlWaiter, hlRunRead, W, 8, 9, ok, 1),
			call(hlWaiter, hlUnlockRead, W, 10, 11, ok, 1),
		), porcupine.Ok},
		{"no release among the racers: the test's Unlock ends the round", history(
			call(4, hlRunIncr, A, 2, 3, ok, 1),
			call(5, hlExtend, A, 2, 4, ok, 0),
			acquireRead(2.5, 3.5, failed, 1),
			call(hlMain, hlUnlock, A, 5, 6, ok, 0),
			acquire(hlWaiter, W, 0.5, 7, ok),
			call(hlWaiter, hlUnlockRead, W, 8, 9, ok, 1),
		), porcupine.Ok},
	}
	for i, tc := range cases {
		res, info := porcupine.CheckOperationsVerbose(hlModel, tc.history, linCheckTimeout)
		if res != tc.want {
			t.Errorf("%s: %s, want %s\n%s", tc.name, res, tc.want, hlDescribe(tc.history))
		}
		if i == 0 && res == porcupine.Illegal {
			path := filepath.Join(t.TempDir(), "broken.html")
			if err := porcupine.VisualizePath(hlModel, info, path); err != nil {
				t.Fatalf("VisualizePath: %v", err)
			}
			if st, err := os.Stat(path); err != nil || st.Size() == 0 {
				t.Fatalf("visualization not written: %v", err)
			}
		}
	}
}
