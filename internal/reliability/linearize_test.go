package reliability

// Linearizability of the mutex, and of a counter written while its lock is
// held, checked with porcupine on histories recorded against a real
// redis-server while faults make some outcomes unknown.
//
// Leases are modelled, not assumed away: a lock whose acquire reply was lost
// is held by nobody's handle, and only its lease frees it, so the runs use a
// short lease and the model lets a lock change hands once the holder's lease
// may have ended. Times are this process's monotonic clock; the server's
// clock on the same host is taken to agree with it within linClockMargin. An
// operation's interval [call, return] bounds its unknown linearization
// point, so the model never rejects a history that a correct lock can
// produce, and still rejects two holders within one lease, a release of a
// lock not held, ErrLocked on a free lock and a lost update (see
// TestLinearizeModelCanFail).
//
// Unknown outcomes. A call that ends in an error other than the package's
// definite answers (ErrLocked, ErrNotHeld) may or may not have taken effect;
// the models accept both (porcupine.NondeterministicModel). If no script
// reply of the call can arrive after the call returned (the command was
// never sent, or its reply was received and dropped by the fault hook), the
// effect happened within the call. Otherwise (a read timeout: the server may
// run the script later) the operation's return time is +infinity, which lets
// porcupine linearize it anywhere after its call. A failed acquire that sent
// no script at all (its deadline passed in the delay hook) had no effect and
// is counted, not recorded.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

const (
	// linLease is the lease of every acquisition in the recorded runs: long
	// next to a hold (up to 1.5 ms), short enough that a lock left behind
	// by a lost acquire reply stalls the run only briefly.
	linLease = 150 * time.Millisecond
	// linClockMargin covers the server's clock against ours and PEXPIRE's
	// millisecond rounding.
	linClockMargin = 5 * time.Millisecond
	// linNever is the return time of an operation that may take effect after
	// it returned.
	linNever = int64(math.MaxInt64)
	// linCheckTimeout bounds each porcupine check; a timeout fails the test.
	// A linearizable history checks in milliseconds; the search is CPU work,
	// so the budget is wide enough for a loaded machine (a violation makes
	// the search long, and still ends in a failure).
	linCheckTimeout = 60 * time.Second
	// linMaxUnbounded bounds the operations whose outcome may settle after
	// they returned: porcupine keeps each pending to the end of the history,
	// so its search grows with their number. 2 in a quiet run (checked in
	// 20 ms); a loaded machine made 10, and the check gave up after 60 s;
	// with 5 it took up to 1 s. The client stops at 3 (one more may be in
	// flight).
	linMaxUnbounded = 3
	// linDropBound bounds when a dropped lock (see linIteration) is released
	// after its Lock returned: Lock waits dropWait (100 ms) for the release,
	// which in practice takes a round trip or none (a local hand-on).
	linDropBound = 200 * time.Millisecond
)

type linOutcome int

const (
	linOK      linOutcome = iota // the call reported success
	linFailed                    // a definite failure: ErrLocked, ErrNotHeld
	linUnknown                   // an error: it may or may not have taken effect
)

func (o linOutcome) String() string { return [...]string{"ok", "failed", "unknown"}[o] }

// ---- the lock model ----

type linOp int

const (
	linAcquire linOp = iota
	linRelease
)

// linLockInput is one acquire or release of name. acq identifies the
// acquisition (its token): an acquire's own id, or the id a release closes.
// call and ret are the operation's interval (ret is linNever when it may take
// effect later), which bound its lease.
type linLockInput struct {
	name      string
	op        linOp
	acq       int
	call, ret int64
	// phantom marks an acquisition nobody asked for: the hand-over to a
	// local waiter that a release whose reply was lost may have made.
	phantom bool
	// locker is the index of the Locker that made the call.
	locker int
}

// linLockState is the holder of one name (0: free), with the interval of its
// acquisition: its lease started within [since, until].
type linLockState struct {
	holder       int
	since, until int64
	// adoptable: the holder is an acquisition of unknown outcome, whose
	// token its Locker remembers; the Locker's next acquisition of the name
	// may take the lock over under that token (mutex/retrysafety.go). locker
	// is the holder's Locker.
	adoptable bool
	locker    int
}

// mayHaveEnded reports whether the holder's lease may be over at some time
// up to t.
func (s linLockState) mayHaveEnded(t int64) bool {
	return s.since+int64(linLease-linClockMargin) <= t
}

// mayBeValid reports whether the holder's lease may still run at some time
// from t on.
func (s linLockState) mayBeValid(t int64) bool {
	return s.until == linNever || t < s.until+int64(linLease+linClockMargin)
}

// linLockStep returns the states a lock can be in after in returned out.
func linLockStep(state, input, output any) []any {
	s, in, out := state.(linLockState), input.(linLockInput), output.(linOutcome)
	free := s.holder == 0 || s.mayHaveEnded(in.ret) // an acquire can take it
	// An orphan of the same Locker: adopted by this acquisition, or not.
	adopt := s.holder != 0 && s.adoptable && s.locker == in.locker
	taken := linLockState{holder: in.acq, since: in.call, until: in.ret, locker: in.locker}
	if in.op == linAcquire {
		orphan := taken
		orphan.adoptable = true
		switch {
		case out == linOK && (free || adopt):
			return []any{taken}
		case out == linFailed && s.holder != 0 && s.mayBeValid(in.call):
			return []any{s} // ErrLocked: held at some point of the call
		case out == linUnknown && (free || adopt):
			return []any{orphan, s}
		case out == linUnknown:
			return []any{s} // failed, or never ran
		}
		return nil
	}
	mine := s.holder == in.acq
	switch {
	case out == linOK && mine && s.mayBeValid(in.call):
		return []any{linLockState{}}
	case out == linFailed && !mine:
		return []any{s} // ErrNotHeld: free, or another token's
	case out == linFailed && s.mayHaveEnded(in.ret):
		return []any{linLockState{}} // ErrNotHeld: our lease ended
	case out == linUnknown && mine:
		return []any{linLockState{}, s}
	case out == linUnknown:
		return []any{s}
	}
	return nil
}

func linHash(xs ...int64) uint64 {
	h := uint64(14695981039346656037)
	for _, x := range xs {
		h = (h ^ uint64(x)) * 1099511628211
	}
	return h
}

var linLockModel = (&porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byName := map[string]int{}
		var out [][]porcupine.Operation
		for _, op := range history {
			n := op.Input.(linLockInput).name
			i, ok := byName[n]
			if !ok {
				i = len(out)
				byName[n] = i
				out = append(out, nil)
			}
			out[i] = append(out[i], op)
		}
		return out
	},
	Init: func() []any { return []any{linLockState{}} },
	Step: linLockStep,
	Hash: func(state any) uint64 {
		s := state.(linLockState)
		adoptable := int64(0)
		if s.adoptable {
			adoptable = 1
		}
		return linHash(int64(s.holder), s.since, s.until, adoptable, int64(s.locker))
	},
	DescribeOperation: func(input, output any) string {
		in := input.(linLockInput)
		verb := [...]string{"acquire", "release"}[in.op]
		if in.phantom {
			verb = "hand-over?"
		}
		return fmt.Sprintf("%s(%s #%d) -> %v", verb, in.name, in.acq, output)
	},
	DescribeState: func(state any) string {
		if s := state.(linLockState); s.holder != 0 {
			return fmt.Sprintf("#%d", s.holder)
		}
		return "free"
	},
}).ToModel()

// ---- the counter model ----

// linCounterInput is an increment (v read with the acquire, v+1 written by
// UnlockWith only while the lock is still held) or a plain read of v.
type linCounterInput struct {
	incr bool
	v    int64
}

func linCounterStep(state, input, output any) []any {
	s, in, out := state.(int64), input.(linCounterInput), output.(linOutcome)
	switch {
	case !in.incr && s == in.v:
		return []any{s}
	case !in.incr:
		return nil
	case out == linOK && s == in.v: // committed: nothing was written since the read
		return []any{in.v + 1}
	case out == linFailed: // ErrNotHeld: the write did not run
		return []any{s}
	case out == linUnknown && s == in.v:
		return []any{in.v + 1, s}
	case out == linUnknown:
		return []any{s}
	}
	return nil
}

var linCounterModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{int64(0)} },
	Step: linCounterStep,
	Hash: func(state any) uint64 { return linHash(state.(int64)) },
	DescribeOperation: func(input, output any) string {
		if in := input.(linCounterInput); in.incr {
			return fmt.Sprintf("incr(%d -> %d) -> %v", in.v, in.v+1, output)
		}
		return fmt.Sprintf("read() -> %d", input.(linCounterInput).v)
	},
	DescribeState: func(state any) string { return strconv.FormatInt(state.(int64), 10) },
}).ToModel()

// ---- faults ----

var linErrInjected = errors.New("injected: reply lost")

// linStats counts, for one operation (carried in its context), the script
// calls that went on towards Redis (sent), and those that ended without a
// reply on a client whose scripts may then still run later (late).
type linStats struct{ sent, late atomic.Int64 }

type linStatsKey struct{}

func linWithStats(ctx context.Context) (context.Context, *linStats) {
	st := new(linStats)
	return context.WithValue(ctx, linStatsKey{}, st), st
}

// linScriptsOnly is a client whose Locker acquires with its script only:
// its SetArgs shadows the client's with another signature.
type linScriptsOnly struct{ *redis.Client }

func (linScriptsOnly) SetArgs() {}

// linLockCommand reports whether cmd acts on a lock or the data it guards:
// a script, or the native SET NX PX of a first attempt (TryLock, Lock). The
// hook below loses and counts these; "script call" in this file means one.
func linLockCommand(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "evalsha", "eval":
		return true
	case "set": // SET key value NX PX ms GET
		for _, a := range cmd.Args()[3:] {
			if strings.EqualFold(fmt.Sprint(a), "nx") {
				return true
			}
		}
	}
	return false
}

// linFaultHook is the innermost hook of every client in the run. With every >
// 0, it loses every nth script call of its client, deterministically:
// alternately before it is sent (it never runs) and after it ran (its reply
// is dropped). Both look alike to the caller: the outcome is unknown, but
// settled before the call returns. It keeps the operation's linStats; with
// late, a script call that ends without a reply counts as late (a read
// timeout: the server may run it after the caller gave up).
type linFaultHook struct {
	every int64
	late  bool
	n     atomic.Int64 // script calls seen
}

func (h *linFaultHook) injected() int64 { return h.n.Load() / max(h.every, 1) }

func (h *linFaultHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *linFaultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *linFaultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !linLockCommand(cmd) {
			return next(ctx, cmd)
		}
		st, _ := ctx.Value(linStatsKey{}).(*linStats)
		if st == nil {
			st = new(linStats)
		}
		k := h.n.Add(1)
		if h.every > 0 && k%h.every == 0 {
			if (k/h.every)%2 == 1 {
				st.sent.Add(1)
				_ = next(ctx, cmd) // it runs; its reply is dropped
			}
			cmd.SetErr(linErrInjected)
			return linErrInjected
		}
		st.sent.Add(1)
		err := next(ctx, cmd)
		var reply redis.Error
		if h.late && err != nil && !errors.As(err, &reply) {
			st.late.Add(1)
		}
		return err
	}
}

// ---- recording ----

// linRecorder collects the two histories, timed on the monotonic clock.
type linRecorder struct {
	start     time.Time
	mu        sync.Mutex
	lock      []porcupine.Operation
	counter   []porcupine.Operation
	nextAcq   atomic.Int64
	unknown   atomic.Int64 // operations with an unknown outcome
	unbounded atomic.Int64 // of which may take effect after they returned
	unsent    atomic.Int64 // failed acquires that sent nothing: TryLocks not recorded, Locks as unknown
}

func (r *linRecorder) now() int64  { return int64(time.Since(r.start)) }
func (r *linRecorder) newAcq() int { return int(r.nextAcq.Add(1)) }

// add records an operation; an unknown outcome that may settle after the
// call returned (late) gets the return time linNever.
func (r *linRecorder) add(history *[]porcupine.Operation, client int, input any, call, ret int64, out linOutcome, late bool) {
	if out == linUnknown {
		r.unknown.Add(1)
		if late {
			r.unbounded.Add(1)
			ret = linNever
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	*history = append(*history, porcupine.Operation{ClientId: client, Input: input, Call: call, Output: out, Return: ret})
}

func (r *linRecorder) addLock(client int, in linLockInput, out linOutcome, late bool) {
	if out == linUnknown && late {
		in.ret = linNever
	}
	r.add(&r.lock, client, in, in.call, in.ret, out, late)
}

// linClient is one Locker on a go-redis client of its own, with its faults.
type linClient struct {
	idx        int // its index: the model's Locker
	locker     *mutex.Locker
	goroutines int
	iterations int // per goroutine
	// shortCtx is the chance (in %) that an acquire gets a 1 ms deadline,
	// shorter than the client's delay hook: it fails before it is sent.
	shortCtx int
	// unbounded: the client's outcomes may settle after its calls return;
	// it stops once linMaxUnbounded such operations are recorded.
	unbounded bool
}

var (
	linReadCounter  = mutex.NewFragment(`return redis.call('GET', KEYS[1])`)
	linWriteCounter = mutex.NewFragment(`redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1`)
)

// TestLinearizeLockAndCounter records the acquire/release history of two
// names taken by 4 Lockers on 4 go-redis clients (10 goroutines), with
// TryLock, Lock (deadlines of 5 to 105 ms), TryLockWith, LockWith, Unlock and
// UnlockWith, while faults make outcomes unknown:
//
//   - client 1 loses every 7th script call, alternately before it is sent
//     and after it ran;
//   - client 2 delays every command by 2 ms, and a quarter of its acquires
//     have a 1 ms deadline;
//   - client 3 has a 2 ms ReadTimeout: a reply late under -race is lost, and
//     its script may run after the caller gave up; it sends scripts only
//     (no native SET NX first attempts: their late replies mean the same,
//     and each unbounded outcome widens porcupine's search);
//   - client 0 is clean.
//
// Name "ctr" guards a counter: each holder reads it with the acquire (the
// fragment of LockWith or TryLockWith) and writes read+1 with UnlockWith,
// which commits only while the lock is held. Porcupine checks the lock
// history against a lock with leases, and the counter history (increments
// and plain reads) against a register.
func TestLinearizeLockAndCounter(t *testing.T) {
	srv := testutil.StartServer(t)
	prefix := testutil.NewPrefix()
	// No retries: each operation's outcome is one script run's. Deadlines
	// bound the reads, so an abandoned call's script runs before its caller
	// returns, or is marked late by the hook.
	base := redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true}

	mk := func(o redis.Options, hooks ...redis.Hook) *redis.Client {
		c := redis.NewClient(&o)
		for _, h := range hooks {
			c.AddHook(h)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	loss := &linFaultHook{every: 7}
	tight := base
	tight.ReadTimeout, tight.WriteTimeout = 2*time.Millisecond, 50*time.Millisecond
	opts := []mutex.Option{mutex.WithPrefix(prefix), mutex.WithTTL(linLease), mutex.WithRetryInterval(5 * time.Millisecond)}
	// Every operation with an unbounded outcome makes porcupine's search
	// wider, most of all when it must prove a violation: the client whose
	// outcomes can be unbounded runs one goroutine, for fewer iterations.
	clients := []linClient{
		{locker: mustLocker(t, mk(base, &linFaultHook{}), opts...), goroutines: 3, iterations: 70},
		{locker: mustLocker(t, mk(base, loss), opts...), goroutines: 3, iterations: 70},
		{locker: mustLocker(t, mk(base, testutil.DelayHook(2*time.Millisecond), &linFaultHook{}), opts...), goroutines: 3, iterations: 70, shortCtx: 25},
		{locker: mustLocker(t, linScriptsOnly{mk(tight, &linFaultHook{late: true})}, opts...), goroutines: 1, iterations: 20, unbounded: true},
	}
	plain := mk(base)
	counterKey := mustKey(t, clients[0].locker, "ctr", "counter")

	rec := &linRecorder{start: time.Now()}
	// Bounds the recording under any load; the iteration counts end it on
	// any machine that is not stalled, so the minimum counts checked below
	// are not a matter of speed.
	stop := time.Now().Add(60 * time.Second)
	var wg sync.WaitGroup
	workers := 0
	for ci := range clients {
		clients[ci].idx = ci
		for range clients[ci].goroutines {
			worker := workers
			workers++
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(worker), 42))
				for i := 0; i < clients[ci].iterations && time.Now().Before(stop); i++ {
					if clients[ci].unbounded && rec.unbounded.Load() >= linMaxUnbounded {
						break // enough of them: each more widens the check's search
					}
					linIteration(rec, &clients[ci], worker, rng, counterKey)
				}
			})
		}
	}
	reader := workers
	done := make(chan struct{})
	var readerWG sync.WaitGroup
	readerWG.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(3 * time.Millisecond):
			}
			linReadCounterOp(t, rec, plain, counterKey, reader)
		}
	})
	wg.Wait()
	close(done)
	readerWG.Wait()
	linReadCounterOp(t, rec, plain, counterKey, reader) // the final value

	acquired, committed := 0, 0
	for _, op := range rec.lock {
		if in := op.Input.(linLockInput); in.op == linAcquire && op.Output == linOK {
			acquired++
		}
	}
	for _, op := range rec.counter {
		if op.Input.(linCounterInput).incr && op.Output == linOK {
			committed++
		}
	}
	t.Logf("lock history: %d operations, %d acquisitions; counter history: %d operations, %d commits; "+
		"%d operations with unknown outcome, %d of them unbounded (return = +inf); %d script calls lost by the hook; "+
		"%d failed acquires that sent nothing (TryLocks not recorded; Locks recorded as unknown, a lock handed to them dropped)",
		len(rec.lock), acquired, len(rec.counter), committed, rec.unknown.Load(), rec.unbounded.Load(), loss.injected(), rec.unsent.Load())
	if acquired < 50 || committed < 10 || rec.unknown.Load() == 0 {
		t.Fatalf("%d acquisitions, %d commits, %d unknown outcomes: the run tested too little", acquired, committed, rec.unknown.Load())
	}
	linCheck(t, "lock", linLockModel, rec.lock)
	linCheck(t, "counter", linCounterModel, rec.counter)
}

// linIteration takes a lock once and releases it, recording every call.
func linIteration(rec *linRecorder, c *linClient, worker int, rng *rand.Rand, counterKey string) {
	counter := rng.IntN(2) == 0
	name := "a"
	if counter {
		name = "ctr"
	}
	blocking := rng.IntN(2) == 0
	wait := time.Duration(5+rng.IntN(100)) * time.Millisecond
	if c.shortCtx > 0 && rng.IntN(100) < c.shortCtx {
		wait = time.Millisecond
	}
	sctx, st := linWithStats(context.Background())
	ctx, cancel := context.WithTimeout(sctx, wait)
	defer cancel()

	acq := rec.newAcq()
	call := rec.now()
	var lk *mutex.Lock
	var res any
	var err error
	read := mutex.Call{Fragment: linReadCounter, Keys: []string{counterKey}}
	switch {
	case counter && blocking:
		lk, res, err = c.locker.LockWith(ctx, name, read)
	case counter:
		lk, res, err = c.locker.TryLockWith(ctx, name, read)
	case blocking:
		lk, err = c.locker.Lock(ctx, name)
	default:
		lk, err = c.locker.TryLock(ctx, name)
	}
	ret := rec.now()
	in := linLockInput{name: name, op: linAcquire, acq: acq, call: call, ret: ret, locker: c.idx}
	switch {
	case err == nil:
		rec.addLock(worker, in, linOK, false)
	case errors.Is(err, mutex.ErrLocked):
		rec.addLock(worker, in, linFailed, false)
	case st.sent.Load() == 0 && !blocking:
		// Nothing reached Redis (a deadline shorter than the delay hook):
		// no effect to check.
		rec.unsent.Add(1)
		return
	case st.sent.Load() == 0:
		// Nothing reached Redis for this call, but a waiter queued in its
		// Locker may be handed the lock by a local holder (no command) just
		// as its ctx ends: it then held the lock, for a caller that left,
		// and dropped it (Lock.drop: handed on, or released in a goroutine
		// of its own, waited for dropWait, 100 ms). Unrecorded, that hold
		// made another Locker's refusal look illegal (testdata/
		// linearize-illegal-2026-11-23.txt). Held or not, then released by
		// ret + linDropBound.
		rec.unsent.Add(1)
		rec.addLock(worker, in, linUnknown, false)
		rec.addLock(worker, linLockInput{name: name, op: linRelease, acq: acq, call: call, ret: ret + int64(linDropBound)}, linUnknown, false)
		return
	default:
		// Unknown: the lock may be held under this call's token by nobody's
		// handle until its lease ends. Lock and LockWith may also have been
		// handed the lock by a local holder just as ctx ended, and released
		// it again before returning: held, then released.
		late := st.late.Load() > 0
		rec.addLock(worker, in, linUnknown, late)
		if blocking {
			rec.addLock(worker, linLockInput{name: name, op: linRelease, acq: acq, call: call, ret: ret}, linUnknown, late)
		}
		return
	}

	time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond) // hold it a little
	v := int64(0)
	if s, ok := res.(string); ok {
		v, _ = strconv.ParseInt(s, 10, 64)
	}
	// An Unlock that fails leaves the handle open: try again, as a caller
	// should, so that a lost reply does not hold the name for a lease. A
	// retry that succeeds answers for the attempts before it (the release
	// record replays one that ran), so its success spans them all, from the
	// first call; one that fails (not held) says nothing of them: each stays
	// an unknown release of its own.
	type attempt struct {
		call, ret int64
		late      bool
	}
	var unknown []attempt
	for try := range 3 {
		rctx, st := linWithStats(context.Background())
		rcall := rec.now()
		var err error
		if counter {
			write := mutex.Call{Fragment: linWriteCounter, Keys: []string{counterKey}, Args: []any{v + 1, 60000}}
			_, err = lk.UnlockWith(rctx, write)
		} else {
			err = lk.Unlock(rctx)
		}
		rret := rec.now()
		out := linOK
		switch {
		case err == nil:
		case errors.Is(err, mutex.ErrNotHeld):
			out = linFailed
		default:
			out = linUnknown
		}
		isLate := st.late.Load() > 0
		if out == linUnknown {
			// A release hands the lock to a local waiter in its own script;
			// if its reply is lost that waiter never learns of it, and the
			// lock stays under a token nobody holds until its lease ends.
			rec.addLock(worker, linLockInput{name: name, op: linAcquire, acq: rec.newAcq(), call: rcall, ret: rret, phantom: true, locker: c.idx}, linUnknown, isLate)
		}
		if counter {
			rec.add(&rec.counter, worker, linCounterInput{incr: true, v: v}, call, rret, out, isLate)
		}
		if out == linUnknown && try < 2 {
			unknown = append(unknown, attempt{rcall, rret, isLate})
			continue
		}
		if out == linOK && len(unknown) > 0 {
			rcall, unknown = unknown[0].call, nil
		}
		for _, u := range unknown {
			rec.addLock(worker, linLockInput{name: name, op: linRelease, acq: acq, call: u.call, ret: u.ret}, linUnknown, u.late)
		}
		rec.addLock(worker, linLockInput{name: name, op: linRelease, acq: acq, call: rcall, ret: rret}, out, isLate)
		return
	}
}

// linReadCounterOp records a plain GET of the counter, not under the lock.
func linReadCounterOp(t *testing.T, rec *linRecorder, c *redis.Client, key string, client int) {
	call := rec.now()
	s, err := c.Get(context.Background(), key).Result()
	ret := rec.now()
	switch {
	case errors.Is(err, redis.Nil):
		s = "0"
	case err != nil:
		t.Errorf("GET of the counter on the clean client: %v", err)
		return
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Errorf("the counter holds %q", s)
		return
	}
	rec.add(&rec.counter, client, linCounterInput{v: v}, call, ret, linOK, false)
}

// linCheck fails t unless porcupine finds history linearizable
// within checkTimeout. On a violation it writes porcupine's visualization to
// a file that outlives the test, and names it.
func linCheck(t *testing.T, what string, model porcupine.Model, history []porcupine.Operation) {
	t.Helper()
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, history, linCheckTimeout)
	t.Logf("%s: porcupine says %s for %d operations, in %v", what, res, len(history), time.Since(start).Round(time.Millisecond))
	if res == porcupine.Ok {
		return
	}
	verdict := "the history is NOT linearizable"
	if res == porcupine.Unknown {
		verdict = fmt.Sprintf("porcupine gave up after %v: the history is unchecked (a violation makes the search long)", linCheckTimeout)
	}
	path := filepath.Join(os.TempDir(), fmt.Sprintf("funnelguard-linearize-%s-%d.html", what, time.Now().UnixNano()))
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		t.Fatalf("%s: %s (and its visualization failed: %v)", what, verdict, err)
	}
	t.Fatalf("%s: %s; visualization of the longest linearizable prefixes: %s", what, verdict, path)
}

// TestLinearizeModelCanFail feeds both models hand-written histories: each
// broken one must be Illegal, so the models are not vacuous, and each
// correct one Ok. The visualization of a broken history is written.
func TestLinearizeModelCanFail(t *testing.T) {
	ms := func(n float64) int64 { return int64(n * float64(time.Millisecond)) }
	L := float64(linLease / time.Millisecond)
	op := func(kind linOp, acq int, call, ret float64, out linOutcome) porcupine.Operation {
		in := linLockInput{name: "a", op: kind, acq: acq, call: ms(call), ret: ms(ret)}
		if ret < 0 {
			in.ret = linNever
		}
		return porcupine.Operation{ClientId: acq - 1, Input: in, Call: in.call, Output: out, Return: in.ret}
	}
	acquire := func(acq int, call, ret float64, out linOutcome) porcupine.Operation {
		return op(linAcquire, acq, call, ret, out)
	}
	acquireBy := func(locker, acq int, call, ret float64, out linOutcome) porcupine.Operation {
		o := op(linAcquire, acq, call, ret, out)
		in := o.Input.(linLockInput)
		in.locker = locker
		o.Input = in
		return o
	}
	release := func(acq int, call, ret float64, out linOutcome) porcupine.Operation {
		return op(linRelease, acq, call, ret, out)
	}
	const inf = -1
	lockCases := []struct {
		name    string
		history []porcupine.Operation
		want    porcupine.CheckResult
	}{
		{"two overlapping successful acquires", []porcupine.Operation{
			acquire(1, 0, 10, linOK), acquire(2, 5, 15, linOK), release(1, 20, 30, linOK), release(2, 20, 30, linOK),
		}, porcupine.Illegal},
		{"a second holder within the first one's lease", []porcupine.Operation{
			acquire(1, 0, 1, linOK), acquire(2, L/2, L/2+1, linOK),
		}, porcupine.Illegal},
		{"a release ok after the lease surely ended", []porcupine.Operation{
			acquire(1, 0, 1, linOK), release(1, 2*L, 2*L+1, linOK),
		}, porcupine.Illegal},
		{"a release ok of a lock never taken", []porcupine.Operation{
			acquire(1, 0, 1, linFailed), release(1, 2, 3, linOK),
		}, porcupine.Illegal},
		{"ErrLocked on a free lock", []porcupine.Operation{
			acquire(1, 0, 1, linOK), release(1, 2, 3, linOK), acquire(2, 4, 5, linFailed),
		}, porcupine.Illegal},
		{"an unknown acquire cannot excuse an overlap", []porcupine.Operation{
			acquire(1, 0, 1, linOK), acquire(3, 2, inf, linUnknown), acquire(2, 4, 5, linOK), release(1, 6, 7, linOK),
		}, porcupine.Illegal},
		{"sequential holders", []porcupine.Operation{
			acquire(1, 0, 1, linOK), acquire(2, 0.5, 2, linFailed), release(1, 3, 4, linOK),
			acquire(2, 5, 6, linOK), release(2, 7, 8, linOK),
		}, porcupine.Ok},
		{"a takeover after the lease ended", []porcupine.Operation{
			acquire(1, 0, 1, linOK), acquire(2, L+1, L+2, linOK), release(1, L+3, L+4, linFailed),
		}, porcupine.Ok},
		{"an unknown acquire that held the lock until its lease ended", []porcupine.Operation{
			acquire(1, 0, inf, linUnknown), acquire(2, 2, 3, linFailed), acquire(2, L+1, L+2, linOK),
		}, porcupine.Ok},
		{"an unknown acquire that never ran", []porcupine.Operation{
			acquire(1, 0, 1, linUnknown), acquire(2, 2, 3, linOK), release(2, 4, 5, linOK),
		}, porcupine.Ok},
		{"an unknown release that did release", []porcupine.Operation{
			acquire(1, 0, 1, linOK), release(1, 2, 3, linUnknown), acquire(2, 4, 5, linOK),
		}, porcupine.Ok},
		// An acquire of unknown outcome that took the lock (ErrLocked says
		// so) leaves it to its own Locker (mutex/retrysafety.go), not another.
		{"another Locker takes an orphan within its lease", []porcupine.Operation{
			acquireBy(0, 1, 0, 1, linUnknown), acquireBy(1, 2, 2, 3, linFailed), acquireBy(1, 3, 4, 5, linOK),
		}, porcupine.Illegal},
		{"a Locker adopts its own orphan", []porcupine.Operation{
			acquireBy(0, 1, 0, 1, linUnknown), acquireBy(1, 2, 2, 3, linFailed), acquireBy(0, 3, 4, 5, linOK),
			release(3, 6, 7, linOK),
		}, porcupine.Ok},
		{"a lock taken with ok is no orphan to adopt", []porcupine.Operation{
			acquireBy(0, 1, 0, 1, linOK), acquireBy(0, 2, 2, 3, linOK),
		}, porcupine.Illegal},
	}
	for _, tc := range lockCases {
		res, info := porcupine.CheckOperationsVerbose(linLockModel, tc.history, linCheckTimeout)
		if res != tc.want {
			t.Errorf("lock model, %s: %s, want %s", tc.name, res, tc.want)
		}
		if res == porcupine.Illegal && tc.name == lockCases[0].name {
			path := filepath.Join(t.TempDir(), "broken.html")
			if err := porcupine.VisualizePath(linLockModel, info, path); err != nil {
				t.Fatalf("VisualizePath: %v", err)
			}
			if st, err := os.Stat(path); err != nil || st.Size() == 0 {
				t.Fatalf("visualization not written: %v", err)
			}
		}
	}

	incr := func(client int, v, call, ret int64, out linOutcome) porcupine.Operation {
		if ret < 0 {
			ret = linNever
		}
		return porcupine.Operation{ClientId: client, Input: linCounterInput{incr: true, v: v}, Call: call, Output: out, Return: ret}
	}
	read := func(v, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 9, Input: linCounterInput{v: v}, Call: call, Output: linOK, Return: ret}
	}
	counterCases := []struct {
		name    string
		history []porcupine.Operation
		want    porcupine.CheckResult
	}{
		{"a lost update: two commits of 0+1", []porcupine.Operation{
			incr(0, 0, 0, 10, linOK), incr(1, 0, 5, 15, linOK), read(2, 20, 21),
		}, porcupine.Illegal},
		{"a read of a value never written", []porcupine.Operation{
			incr(0, 0, 0, 10, linOK), read(2, 20, 21),
		}, porcupine.Illegal},
		{"a refused commit that took effect", []porcupine.Operation{
			incr(0, 0, 0, 10, linFailed), read(1, 20, 21),
		}, porcupine.Illegal},
		{"increments in turn, one unknown that landed", []porcupine.Operation{
			incr(0, 0, 0, 10, linOK), incr(1, 1, 11, inf, linUnknown), incr(2, 1, 30, 40, linFailed),
			read(2, 50, 51), incr(0, 2, 60, 70, linOK), read(3, 80, 81),
		}, porcupine.Ok},
		{"an unknown increment that never landed", []porcupine.Operation{
			incr(0, 0, 0, 10, linOK), incr(1, 1, 11, 12, linUnknown), incr(2, 1, 30, 40, linOK), read(2, 50, 51),
		}, porcupine.Ok},
	}
	for _, tc := range counterCases {
		if res := porcupine.CheckOperationsTimeout(linCounterModel, tc.history, linCheckTimeout); res != tc.want {
			t.Errorf("counter model, %s: %s, want %s", tc.name, res, tc.want)
		}
	}
}
