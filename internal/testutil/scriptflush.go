package testutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Helpers for the tests of a lost script cache: SCRIPT FLUSH, or a failover
// to a replica whose cache never held the scripts. A client that runs its
// scripts with redis.Script.Run sends EVALSHA, gets NOSCRIPT and sends the
// body with EVAL: one extra round trip per script, and no error. These
// helpers empty the cache under load (FlushLoad), count what the clients
// saw meanwhile (ScriptStats), and compare a call made right after a flush
// with the same call made again (FlushCost, FlushCostOf).

// ScriptStats is a go-redis hook (client.AddHook) that counts the commands a
// client sends, its EVALSHA and EVAL (and _RO forms), the NOSCRIPT replies,
// and every other error but redis.Nil and those of a connection's handshake,
// in pipelines too. Safe for concurrent use; one ScriptStats can watch
// several clients.
type ScriptStats struct {
	Commands, EvalSha, Eval, NoScript, Errors atomic.Int64

	mu     sync.Mutex
	sample []string // the first few other errors
}

var _ redis.Hook = (*ScriptStats)(nil)

// maxSample bounds the errors a ScriptStats keeps for the failure message.
const maxSample = 5

// IsNoScript reports whether err is Redis's NOSCRIPT reply to an EVALSHA.
func IsNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// count counts cmd, which got err.
func (s *ScriptStats) count(cmd redis.Cmder, err error) {
	s.Commands.Add(1)
	switch strings.ToLower(cmd.Name()) {
	case "evalsha", "evalsha_ro":
		s.EvalSha.Add(1)
	case "eval", "eval_ro":
		s.Eval.Add(1)
	}
	switch name := strings.ToLower(cmd.Name()); {
	case err == nil, errors.Is(err, redis.Nil):
	case name == "hello" || name == "client":
		// A new connection's handshake: go-redis tries commands that an
		// older server refuses (CLIENT SETINFO), and carries on.
	case IsNoScript(err):
		s.NoScript.Add(1)
	default:
		s.Errors.Add(1)
		s.mu.Lock()
		if len(s.sample) < maxSample {
			s.sample = append(s.sample, fmt.Sprintf("%s: %v", cmd.Name(), err))
		}
		s.mu.Unlock()
	}
}

// Sample returns the first few errors counted in Errors.
func (s *ScriptStats) Sample() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sample...)
}

func (s *ScriptStats) String() string {
	return fmt.Sprintf("%d commands, %d EVALSHA, %d NOSCRIPT, %d EVAL, %d other errors %q",
		s.Commands.Load(), s.EvalSha.Load(), s.NoScript.Load(), s.Eval.Load(), s.Errors.Load(), s.Sample())
}

// Check fails t unless the clients saw at least minNoScript NOSCRIPT
// replies (the cache loss did reach them), sent one EVAL per NOSCRIPT and
// none besides (the fallback of redis.Script.Run, and nothing else sends a
// body), and got no other error. who names the clients in messages.
func (s *ScriptStats) Check(t testing.TB, who string, minNoScript int64) {
	t.Helper()
	if n := s.NoScript.Load(); n < minNoScript {
		t.Errorf("%s: %d NOSCRIPT replies, want at least %d: the flushes did not reach the calls, and the test proves nothing (%v)", who, n, minNoScript, s)
	}
	if ns, ev := s.NoScript.Load(), s.Eval.Load(); ev != ns {
		t.Errorf("%s: %d EVAL for %d NOSCRIPT replies, want one each (%v)", who, ev, ns, s)
	}
	if n := s.Errors.Load(); n != 0 {
		t.Errorf("%s: %d errors other than NOSCRIPT: %q", who, n, s.Sample())
	}
}

func (s *ScriptStats) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (s *ScriptStats) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		s.count(cmd, err) // not cmd.Err(): see ReplyErrors
		return err
	}
}

func (s *ScriptStats) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			s.count(cmd, cmd.Err())
		}
		return err
	}
}

// Record returns a CommandRecorder added to c's hooks (it sees each
// command's error reply, NOSCRIPT among them).
func Record(c interface{ AddHook(redis.Hook) }) *CommandRecorder {
	rec := &CommandRecorder{}
	c.AddHook(rec)
	return rec
}

// ScriptFlush empties the script cache of each server at addrs, over a
// client of its own.
func ScriptFlush(ctx context.Context, addrs ...string) error {
	var errs []error
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		errs = append(errs, c.ScriptFlush(ctx).Err())
		c.Close()
	}
	return errors.Join(errs...)
}

// The load of the script cache tests: FlushWorkers goroutines, and at least
// MinFlushes SCRIPT FLUSH during their calls for a run to prove anything.
const (
	FlushWorkers = 64
	MinFlushes   = 20
)

// A Load is what FlushLoad did.
type Load struct {
	// Calls is how many calls were made, Flushes how many SCRIPT FLUSH
	// rounds (one per server) ran between them.
	Calls, Flushes int64
	// Errors are the calls' errors, each naming its worker and call.
	Errors []error
}

// FlushLoad runs workers goroutines that each make calls calls of
// call(ctx, worker, i) in a loop, while another goroutine, over clients of
// its own, empties the script cache of the servers at addrs with SCRIPT
// FLUSH after every `every` calls completed in all. The worker whose call
// completes such a count waits for that flush before its next call, so that
// every flush lands among the calls, however the scheduler treats the
// flushing goroutine; the other workers carry on meanwhile. The load is
// counted, not timed: the number of calls and of flushes is the same on a
// fast machine as on a loaded one. A flush that fails fails t.
func FlushLoad(t testing.TB, ctx context.Context, addrs []string, workers, calls, every int, call func(ctx context.Context, w, i int) error) Load {
	t.Helper()
	flushers := make([]*redis.Client, len(addrs))
	for i, addr := range addrs {
		flushers[i] = redis.NewClient(&redis.Options{Addr: addr})
		defer flushers[i].Close()
	}
	ticks := make(chan chan struct{})
	var flushes atomic.Int64
	var flushErr error
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		for tick := range ticks {
			for _, c := range flushers {
				if err := c.ScriptFlush(ctx).Err(); err != nil && flushErr == nil {
					flushErr = fmt.Errorf("SCRIPT FLUSH on %s: %w", c.Options().Addr, err)
				}
			}
			flushes.Add(1)
			close(tick)
		}
	}()

	var done atomic.Int64
	var mu sync.Mutex
	var errs []error
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			<-start
			for i := range calls {
				if err := call(ctx, w, i); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("worker %d, call %d: %w", w, i, err))
					mu.Unlock()
				}
				if done.Add(1)%int64(every) == 0 {
					tick := make(chan struct{})
					ticks <- tick
					<-tick
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(ticks)
	<-flushed
	if flushErr != nil {
		t.Fatal(flushErr)
	}
	return Load{Calls: done.Load(), Flushes: flushes.Load(), Errors: errs}
}

// Check fails t for every error of the load's calls (the first few named),
// and unless at least minFlushes flushes ran.
func (l Load) Check(t testing.TB, minFlushes int64) {
	t.Helper()
	if l.Flushes < minFlushes {
		t.Errorf("%d SCRIPT FLUSH among %d calls, want at least %d", l.Flushes, l.Calls, minFlushes)
	}
	if len(l.Errors) > 0 {
		t.Errorf("%d of %d calls failed with the script cache flushed under them; the first: %v", len(l.Errors), l.Calls, errors.Join(l.Errors[:min(len(l.Errors), maxSample)]...))
	}
}

// A Cost is what a call made right after the script cache was emptied
// took beyond the same call made again (FlushCost).
type Cost struct {
	// Trips and Commands are the extra round trips and commands.
	Trips, Commands int
	// Scripts is the number of distinct scripts the call runs.
	Scripts int
}

// FlushCost compares the commands of a call made right after the script
// cache was emptied (after) with those of the same call made again (again),
// each as a CommandRecorder saw them. It checks that again got no NOSCRIPT
// and sent no EVAL; that in after each script the call runs answered
// NOSCRIPT once, at its first EVALSHA, and that the round trip of that
// EVALSHA (alone, or a pipeline such as EVALSHA and WAIT) was made again at
// once with EVAL in its place; and that without those round trips after sent
// what again sent. It returns the extra cost, or an error saying how after
// or again broke that. Run the calls serially: a flush or another call
// between them changes the commands.
func FlushCost(after, again []Command) (Cost, error) {
	scripts := map[string]bool{}
	for _, c := range again {
		if IsNoScript(c.Err) {
			return Cost{}, fmt.Errorf("the call made again got NOSCRIPT for script %.12s", c.Script)
		}
		if isEval(c) {
			return Cost{}, fmt.Errorf("the call made again sent the body of script %.12s (EVAL)", c.Script)
		}
		if c.Script != "" {
			scripts[c.Script] = true
		}
	}
	trips := byTrip(after)
	var kept []Command
	var cost Cost
	missed := map[string]bool{}
	for i := 0; i < len(trips); i++ {
		trip := trips[i]
		var lost []int // positions of the NOSCRIPT replies
		for j, c := range trip {
			if IsNoScript(c.Err) {
				if missed[c.Script] {
					return Cost{}, fmt.Errorf("script %.12s answered NOSCRIPT twice in one call", c.Script)
				}
				missed[c.Script] = true
				lost = append(lost, j)
			}
		}
		if lost == nil {
			for _, c := range trip {
				if isEval(c) {
					return Cost{}, fmt.Errorf("EVAL of script %.12s without a NOSCRIPT in the round trip before", c.Script)
				}
			}
			kept = append(kept, trip...)
			continue
		}
		// The round trip again, with EVAL for each EVALSHA that missed.
		if i+1 == len(trips) || strings.Join(Shapes(trips[i+1]), "") != strings.Join(Shapes(trip), "") {
			return Cost{}, fmt.Errorf("the round trip %q, answered NOSCRIPT, was not made again at once", Shapes(trip))
		}
		next := trips[i+1]
		for j, c := range next {
			if slices.Contains(lost, j) != isEval(c) {
				return Cost{}, fmt.Errorf("the round trip %q, answered NOSCRIPT, was made again as %q", names(trip), names(next))
			}
		}
		cost.Trips++
		cost.Commands += len(trip)
		kept = append(kept, next...)
		i++
	}
	got, want := Shapes(kept), Shapes(again)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		return Cost{}, fmt.Errorf("after the flush, less the round trips answered NOSCRIPT, the call sent\n\t%s\nand made again\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
	for s := range scripts {
		if !missed[s] {
			return Cost{}, fmt.Errorf("script %.12s did not answer NOSCRIPT after the flush: was the cache emptied?", s)
		}
	}
	cost.Scripts = len(scripts)
	return cost, nil
}

func isEval(c Command) bool { return c.Name == "eval" || c.Name == "eval_ro" }

// byTrip splits cmds into their round trips.
func byTrip(cmds []Command) [][]Command {
	var out [][]Command
	for i, c := range cmds {
		if i == 0 || c.Trip != cmds[i-1].Trip {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], c)
	}
	return out
}

func names(cmds []Command) []string {
	out := make([]string, len(cmds))
	for i, c := range cmds {
		out[i] = c.Name
	}
	return out
}

// FlushCostOf measures what a script cache loss costs op: it runs op(ctx,
// run) serially three times, for runs 0, 1 and 2 (op makes the same calls
// on fresh names each run): to warm up, right after flush, and once more.
// rec records the client the flush reaches (see Record: it must see the
// NOSCRIPT replies); unflushed, the clients of
// servers it does not reach (a quorum's other nodes), which must send no
// EVAL after the warm-up. It fails t when op fails or FlushCost refuses
// the commands, and returns the cost.
func FlushCostOf(t testing.TB, flush func(context.Context) error, op func(ctx context.Context, run int) error, rec *CommandRecorder, unflushed ...*CommandRecorder) Cost {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := op(ctx, 0); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	for _, r := range unflushed {
		r.Reset()
	}
	if err := flush(ctx); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	rec.Reset()
	if err := op(ctx, 1); err != nil {
		t.Fatalf("the call right after SCRIPT FLUSH failed: %v", err)
	}
	after := rec.Commands()
	rec.Reset()
	if err := op(ctx, 2); err != nil {
		t.Fatalf("the call made again failed: %v", err)
	}
	again := rec.Commands()
	cost, err := FlushCost(after, again)
	if err != nil {
		t.Fatalf("%v\nright after the flush:\n\t%s", err, strings.Join(Shapes(after), "\n\t"))
	}
	if cost.Trips > cost.Scripts {
		t.Fatalf("%d extra round trips for %d scripts", cost.Trips, cost.Scripts)
	}
	for i, r := range unflushed {
		for _, c := range r.Commands() {
			if IsNoScript(c.Err) || isEval(c) {
				t.Fatalf("unflushed client %d: %s %.12s (%v) after the warm-up", i, c.Name, c.Script, c.Err)
			}
		}
	}
	return cost
}

func (c Cost) String() string {
	return fmt.Sprintf("%d extra round trips (%d commands) for %d scripts", c.Trips, c.Commands, c.Scripts)
}
