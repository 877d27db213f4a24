package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"
)

// workerEnv names the environment variable that makes this binary a worker
// of a multi-process case (benchCase.procs): its value is a workerSpec in
// JSON. It is not a flag, so that -help does not offer it.
const workerEnv = "FUNNELGUARD_BENCH_WORKER"

// Timing of a multi-process round: the workers start timing together
// workerLead after the parent starts them (time to exec and prepare), and
// are killed if they have not exited workerGrace after the round's end.
const (
	workerLead  = 500 * time.Millisecond
	workerGrace = 30 * time.Second
)

// A workerSpec is one worker's round: the server (a loopback address, the
// parent's), the subject, the key prefix shared by the round's workers, and
// when to start timing and for how long.
type workerSpec struct {
	Addr       string        `json:"addr"`
	Lib        string        `json:"lib"`
	Prefix     string        `json:"prefix"`
	Goroutines int           `json:"goroutines"`
	Duration   time.Duration `json:"duration"`
	Start      time.Time     `json:"start"`
}

// A workerResult is the one line a worker prints on stdout: its sample, and
// how late it started timing.
type workerResult struct {
	Ops     int64         `json:"ops"`
	GaveUp  int64         `json:"gave_up"`
	Elapsed time.Duration `json:"elapsed"`
	Mallocs uint64        `json:"mallocs"`
	Cmds    int64         `json:"cmds"`
	Late    time.Duration `json:"late"`
}

// measureProcs runs one round of spec's subject in procs worker processes
// on one key prefix and sums their samples: ops over the longest worker's
// elapsed time (their windows start together). Server stats are read here,
// around the whole round.
func measureProcs(ctx context.Context, spec workerSpec, procs int) (sample, error) {
	e := newEnv(spec.Addr, spec.Goroutines)
	defer e.close(context.WithoutCancel(ctx)) // the workers' keys too
	c := e.client()
	server0 := readServerStats(ctx, c)
	spec.Prefix, spec.Start = e.prefix, time.Now().Add(workerLead)
	results, err := runWorkers(ctx, spec, procs)
	if err != nil {
		return sample{}, err
	}
	var s sample
	for _, r := range results {
		s.ops += r.Ops
		s.gaveUp += r.GaveUp
		s.elapsed = max(s.elapsed, r.Elapsed)
		s.mallocs += r.Mallocs
		s.cmds += r.Cmds
		if r.Late > 50*time.Millisecond {
			fmt.Fprintf(os.Stderr, "bench: a worker of %s started timing %v late\n", spec.Lib, r.Late)
		}
	}
	s.server = readServerStats(ctx, c).minus(server0)
	return s, nil
}

// runWorkers starts n workers of spec at once and waits for them. When
// one fails, when ctx ends, or past the round's end plus workerGrace, the
// others are killed by pid (exec.CommandContext).
func runWorkers(ctx context.Context, spec workerSpec, n int) ([]workerResult, error) {
	exe, err := os.Executable() // os.Args[0], as a path that does not depend on the working directory
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithDeadline(ctx, spec.Start.Add(spec.Duration+workerGrace))
	defer cancel()
	var ws []*worker
	for range n {
		w := &worker{cmd: exec.CommandContext(ctx, exe)}
		w.cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
		w.cmd.Stdout, w.cmd.Stderr = &w.out, &w.errOut
		w.cmd.WaitDelay = time.Second
		if err := w.cmd.Start(); err != nil {
			cancel()
			_, _ = waitWorkers(ws, cancel)
			return nil, err
		}
		ws = append(ws, w)
	}
	return waitWorkers(ws, cancel)
}

// A worker is a started worker process and its output.
type worker struct {
	cmd         *exec.Cmd
	out, errOut bytes.Buffer
}

// waitWorkers waits for every worker, cancels (kills the others) at the
// first failure, and returns that failure or every worker's result.
func waitWorkers(ws []*worker, cancel func()) ([]workerResult, error) {
	results := make([]workerResult, len(ws))
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			if err := w.wait(&results[i]); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		})
	}
	wg.Wait()
	return results, first
}

// wait waits for w to exit and parses its line into r.
func (w *worker) wait(r *workerResult) error {
	if err := w.cmd.Wait(); err != nil {
		return fmt.Errorf("worker pid %d: %w: %s", w.cmd.Process.Pid, err, bytes.TrimSpace(w.errOut.Bytes()))
	}
	if err := json.Unmarshal(w.out.Bytes(), r); err != nil || bytes.Count(w.out.Bytes(), []byte("\n")) != 1 {
		return fmt.Errorf("worker pid %d: want one JSON line on stdout, got %q", w.cmd.Process.Pid, w.out.String())
	}
	return nil
}

// runWorker is a worker process's main: it measures spec's subject on the
// parent's server and prints its result as one line. It returns the exit
// status.
func runWorker(raw string) int {
	r, err := work(raw)
	if err == nil {
		err = json.NewEncoder(os.Stdout).Encode(r)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		return 1
	}
	return 0
}

// work runs a worker's round: prepared, it waits for spec.Start, then
// measures for spec.Duration. Only a loopback address is accepted.
func work(raw string) (workerResult, error) {
	var spec workerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return workerResult{}, fmt.Errorf("%s: %w", workerEnv, err)
	}
	if err := checkLoopback(spec.Addr); err != nil {
		return workerResult{}, err
	}
	if spec.Prefix == "" || spec.Goroutines < 1 || spec.Duration <= 0 {
		return workerResult{}, errors.New("incomplete worker spec")
	}
	prepare, err := workerSubject(spec.Lib, spec.Prefix)
	if err != nil {
		return workerResult{}, err
	}
	ctx, cancel := context.WithDeadline(context.Background(), spec.Start.Add(spec.Duration+workerGrace))
	defer cancel()
	var late time.Duration
	s, err := measure(ctx, spec.Addr, spec.Goroutines, spec.Duration, func(ctx context.Context, e *env) (workload, error) {
		w, err := prepare(ctx, e)
		if late = time.Since(spec.Start); late < 0 {
			time.Sleep(-late)
			late = 0
		}
		return w, err
	})
	return workerResult{Ops: s.ops, GaveUp: s.gaveUp, Elapsed: s.elapsed, Mallocs: s.mallocs, Cmds: s.cmds, Late: late}, err
}
