// Command bench compares funnelguard's mutex, semaphore and funnel with their
// peers (bsm/redislock, go-redsync/redsync, a minimal SET NX lock,
// go-redis/redis_rate, hibiken/asynq's semaphore) against one Redis server,
// and prints a Markdown table or JSON lines.
//
//	go run . [-redis 127.0.0.1:6379] [-duration 3s] [-goroutines 64] [-rounds 3] [-json]
//
// Without -redis it starts its own redis-server on a free loopback port and
// stops it at the end. See README.md for the cases.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

// config holds the flags.
type config struct {
	addr       string
	duration   time.Duration
	goroutines int
	rounds     int
	json       bool
	memory     bool
	cases      string
}

func main() {
	if spec, ok := os.LookupEnv(workerEnv); ok { // a multi-process case's worker (workers.go)
		os.Exit(runWorker(spec))
	}
	var cfg config
	flag.StringVar(&cfg.addr, "redis", "", "address of a loopback Redis to use (default: spawn redis-server)")
	flag.DurationVar(&cfg.duration, "duration", 3*time.Second, "length of one round of one library")
	flag.IntVar(&cfg.goroutines, "goroutines", 64, "goroutines of parallel and contended cases (a multiple of 4)")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds per case; libraries alternate A B A B and the median is reported")
	flag.BoolVar(&cfg.json, "json", false, "print one JSON object per case and library instead of tables")
	flag.StringVar(&cfg.cases, "cases", "", "run only the cases whose name matches this regexp (PING cases always run)")
	flag.BoolVar(&cfg.memory, "memory", true, "measure memory and keys left after TTLs (waits about 1 s)")
	flag.Parse()
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run validates the flags, provides the server and runs every case.
func run(cfg config) error {
	if cfg.duration <= 0 || cfg.rounds < 1 || cfg.goroutines < 4 || cfg.goroutines%4 != 0 {
		return errors.New("want -duration > 0, -rounds >= 1, -goroutines a multiple of 4")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	stopServer, err := provideServer(&cfg)
	defer stopServer() // by pid, also on error and on interrupt (run returns)
	if err != nil {
		return err
	}
	cases, err := selectCases(cfg)
	if err != nil {
		return err
	}
	start := time.Now()
	replicated, stopReplicated, err := spawnReplicated(cases)
	defer stopReplicated()
	if err != nil {
		return err
	}
	var sums []summary
	ping := map[bool]float64{}
	for _, bc := range cases {
		addr := cfg.addr
		if bc.replicated {
			addr = replicated
		}
		s, err := runCase(ctx, cfg, bc, addr, ping)
		if err != nil {
			return err
		}
		sums = append(sums, s...)
	}
	var mem []memRow
	if cfg.memory {
		var err error
		if mem, err = measureMemory(ctx, cfg.addr); err != nil {
			return fmt.Errorf("memory: %w", err)
		}
	}
	if cfg.json {
		return writeJSON(os.Stdout, sums, mem)
	}
	writeMarkdown(os.Stdout, sums, mem, time.Since(start), cfg.rounds, cfg.duration, cfg.goroutines)
	return nil
}

// provideServer starts a redis-server on a free loopback port unless -redis
// names one, which must be a loopback address, and sets cfg.addr.
func provideServer(cfg *config) (stop func(), err error) {
	if cfg.addr != "" {
		return func() {}, checkLoopback(cfg.addr)
	}
	srv, err := testutil.Spawn()
	if err != nil {
		return func() {}, fmt.Errorf("needs redis-server (apt-get install redis-server) or -redis: %w", err)
	}
	cfg.addr = srv.Addr
	fmt.Fprintf(os.Stderr, "bench: redis-server pid %d on %s\n", srv.Pid(), srv.Addr)
	return srv.Stop, nil
}

// selectCases is the PING cases, the reference of every ×PING column, and
// the others that -cases matches.
func selectCases(cfg config) ([]benchCase, error) {
	only, err := regexp.Compile(cfg.cases)
	if err != nil {
		return nil, fmt.Errorf("-cases: %w", err)
	}
	cases := pingCases()
	for _, bc := range allCases(cfg.goroutines) {
		if only.MatchString(bc.name) {
			cases = append(cases, bc)
		}
	}
	return cases, nil
}

// allCases are the cases but PING's, in the report's order.
func allCases(goroutines int) []benchCase {
	var out []benchCase
	for _, cs := range [][]benchCase{uncontendedCases(), defaultClientCases(), replicaCases(),
		contendedCases(goroutines), rateCases(), hotCases(goroutines), semCases(goroutines)} {
		out = append(out, cs...)
	}
	return out
}

// spawnReplicated starts a master with one replica if a case needs them,
// and returns the master's address and how to stop both (by pid).
func spawnReplicated(cases []benchCase) (addr string, stop func(), err error) {
	for _, bc := range cases {
		if !bc.replicated {
			continue
		}
		r, err := testutil.SpawnReplicated(1)
		if r == nil {
			return "", func() {}, fmt.Errorf("%s needs a master and a replica: %w", bc.name, err)
		}
		if err != nil {
			return "", r.Stop, fmt.Errorf("%s needs a master and a replica: %w", bc.name, err)
		}
		fmt.Fprintf(os.Stderr, "bench: master pid %d on %s, replica pid %d, for %s\n", r.Master.Pid(), r.Master.Addr, r.Replicas[0].Pid(), bc.name)
		return r.Master.Addr, r.Stop, nil
	}
	return "", func() {}, nil
}

// runCase runs a case's rounds, its subjects alternating, and returns one
// summary per subject; ping holds the PING cases' ops/s once measured.
func runCase(ctx context.Context, cfg config, bc benchCase, addr string, ping map[bool]float64) ([]summary, error) {
	samples := make([][]sample, len(bc.subjects))
	for round := range cfg.rounds {
		ss, err := measureRound(ctx, cfg, bc, addr)
		if err != nil {
			return nil, fmt.Errorf("%s, round %d: %w", bc.name, round+1, err)
		}
		for i, s := range ss {
			samples[i] = append(samples[i], s)
		}
	}
	sums := make([]summary, len(bc.subjects))
	for i, sub := range bc.subjects {
		s := summarize(bc, sub.lib, samples[i])
		if bc.name == pingSerial || bc.name == pingParallel {
			ping[bc.parallel] = s.OpsPerSec
		}
		s.XPing = s.OpsPerSec / ping[bc.parallel]
		sums[i] = s
	}
	setRatios(bc, sums)
	for _, s := range sums {
		printProgress(s)
	}
	return sums, nil
}

// measureRound runs one round of every subject of bc: in turns within the
// round (interleave.go), or one after the other (A B A B ... over rounds).
func measureRound(ctx context.Context, cfg config, bc benchCase, addr string) ([]sample, error) {
	if bc.interleaved() {
		return measureTurns(ctx, cfg, bc, addr)
	}
	out := make([]sample, len(bc.subjects))
	for i, sub := range bc.subjects {
		s, err := measureSubject(ctx, cfg, bc, sub, addr)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sub.lib, err)
		}
		out[i] = s
	}
	return out, nil
}

// measureSubject runs one round of one subject, in this process or in
// bc.procs workers.
func measureSubject(ctx context.Context, cfg config, bc benchCase, sub subject, addr string) (sample, error) {
	if bc.measure != nil {
		return bc.measure(ctx, addr, sub.lib, cfg.duration)
	}
	if bc.procs > 0 {
		return measureProcs(ctx, workerSpec{Addr: addr, Lib: sub.lib, Goroutines: cfg.goroutines / bc.procs, Duration: cfg.duration}, bc.procs)
	}
	return measure(ctx, addr, cfg.goroutines, cfg.duration, sub.prepare)
}

// printProgress prints a summary's line on stderr.
func printProgress(s summary) {
	var extra []string
	if s.Ratio != nil {
		extra = append(extra, fmt.Sprintf("%5.2f× %s", *s.Ratio, s.RatioTo))
	}
	if s.InnerCmdsPerOp != nil {
		extra = append(extra, fmt.Sprintf("%5.2f server cmds/op  %4.2f scripts/op", *s.InnerCmdsPerOp, *s.ScriptCallsPerOp))
	}
	fmt.Fprintf(os.Stderr, "bench: %-45s %-14s %9.0f ops/s  %5.2f×PING  %5.2f cmds/op  %4.0f allocs/op  %s\n",
		s.Case, s.Lib, s.OpsPerSec, s.XPing, s.CmdsPerOp, s.AllocsPerOp, strings.Join(extra, "  "))
}
