package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// turns is how many turns each subject of an interleaved case takes in one
// round: it runs for -duration/turns, then the next subject does, A B C A B
// C ..., until each has run -duration.
//
// Why: an uncontended cycle's rate follows the loopback's latency, which
// moves by 2x within minutes on a shared VM (PING serial 27k/s and 54k/s in
// two runs of one hour). With whole rounds of 2 s in turn, a slow spell that
// falls on one library's round moves the ratio by more than the margins of
// its targets; with turns of 100 ms every library meets the same spells.
// Contended cases keep whole rounds: a turn's end would cut their waits.
const turns = 20

// interleaved reports whether bc's subjects take turns within each round:
// a case that asks for it (the uncontended lock cycles, the admissions of
// fresh keys and of returning keys: calls that wait for no one),
// with several subjects that run in this process.
func (bc benchCase) interleaved() bool {
	return bc.turns && bc.procs == 0 && bc.measure == nil && len(bc.subjects) > 1
}

// measureTurns is one round of an interleaved case: every subject is
// prepared in an env of its own, then they take turns (see turns). Each
// subject's sample sums its turns. Set-up is neither timed nor counted.
func measureTurns(ctx context.Context, cfg config, bc benchCase, addr string) ([]sample, error) {
	envs := make([]*env, len(bc.subjects))
	loads := make([]workload, len(bc.subjects))
	defer func() {
		for _, e := range envs {
			if e != nil {
				e.close(context.WithoutCancel(ctx))
			}
		}
	}()
	for i, sub := range bc.subjects {
		envs[i] = newEnv(addr, cfg.goroutines)
		w, err := sub.prepare(ctx, envs[i])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sub.lib, err)
		}
		loads[i] = w
	}
	runtime.GC()
	out := make([]sample, len(bc.subjects))
	// next[i][g] is goroutine g's next sequence number in subject i: it goes
	// on from turn to turn (a call's key may depend on it).
	next := make([][]int, len(bc.subjects))
	for i, w := range loads {
		next[i] = make([]int, w.goroutines)
	}
	slice := cfg.duration / turns
	for range turns {
		for i := range bc.subjects {
			s, err := measureTurn(ctx, envs[i], loads[i], next[i], slice)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", bc.subjects[i].lib, err)
			}
			out[i] = out[i].plus(s)
		}
	}
	for i, w := range loads {
		if err := finish(w, out[i], cfg.duration); err != nil {
			return nil, fmt.Errorf("%s: %w", bc.subjects[i].lib, err)
		}
	}
	return out, nil
}

// measureTurn runs w, prepared in e, for d: one turn of one subject; next
// holds each goroutine's next sequence number.
func measureTurn(ctx context.Context, e *env, w workload, next []int, d time.Duration) (sample, error) {
	return timed(ctx, e, func() (int64, int64, time.Duration, error) { return turn(ctx, w, next, d) })
}

// turnGrace is how long after its turn's end a call may still run: its
// context's deadline is that much later, so that the end of a turn cuts no
// call short (a SET NX whose reply is cut leaves a lock that the subject's
// next turn would find held). Every call still carries a deadline about as
// far as a whole round's (-duration), as in the cases that do not take turns.
const turnGrace = 2 * time.Second

// turn runs w's goroutines until d has passed and returns the calls that
// completed meanwhile and the time until the last of them returned: each
// goroutine starts no call after d, and the calls under way then finish.
// Goroutine g numbers its calls from next[g] on, and leaves there the
// number after its last. The first error of a call ends the turn early.
func turn(ctx context.Context, w workload, next []int, d time.Duration) (ops, gaveUp int64, elapsed time.Duration, err error) {
	octx, cancel := context.WithTimeout(ctx, d+turnGrace)
	defer cancel()
	var nOps, nGaveUp atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	start := time.Now()
	end := start.Add(d)
	for g := range w.goroutines {
		wg.Go(func() {
			i := next[g]
			defer func() { next[g] = i }()
			for ; time.Now().Before(end) && octx.Err() == nil; i++ {
				switch opErr := w.op(octx, g, i); {
				case opErr == nil:
					nOps.Add(1)
				case errors.Is(opErr, errGaveUp):
					nGaveUp.Add(1)
				default:
					errOnce.Do(func() { err = opErr; cancel() })
				}
			}
		})
	}
	wg.Wait()
	return nOps.Load(), nGaveUp.Load(), time.Since(start), err
}

// plus is s with the turn t added.
func (s sample) plus(t sample) sample {
	return sample{
		ops:     s.ops + t.ops,
		gaveUp:  s.gaveUp + t.gaveUp,
		elapsed: s.elapsed + t.elapsed,
		mallocs: s.mallocs + t.mallocs,
		cmds:    s.cmds + t.cmds,
		server:  s.server.plus(t.server),
	}
}

// finish checks a subject's round: some operation completed in d, and its
// workload's after check holds.
func finish(w workload, s sample, d time.Duration) error {
	if s.ops == 0 {
		return fmt.Errorf("no operation completed in %v", d)
	}
	if w.after != nil {
		return w.after()
	}
	return nil
}
