// Command bench compares funnelguard's mutex and funnel with their peers
// (bsm/redislock, go-redsync/redsync, a minimal SET NX lock, go-redis/redis_rate)
// against one Redis server, and prints a Markdown table or JSON lines.
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
	if cfg.addr == "" {
		srv, err := testutil.Spawn()
		if err != nil {
			return fmt.Errorf("needs redis-server (apt-get install redis-server) or -redis: %w", err)
		}
		defer srv.Stop() // by pid, also on error and on interrupt (run returns)
		cfg.addr = srv.Addr
		fmt.Fprintf(os.Stderr, "bench: redis-server pid %d on %s\n", srv.Pid(), srv.Addr)
	} else if err := checkLoopback(cfg.addr); err != nil {
		return err
	}

	only, err := regexp.Compile(cfg.cases)
	if err != nil {
		return fmt.Errorf("-cases: %w", err)
	}
	start := time.Now()
	cases := pingCases() // the reference of every ×PING column
	for _, bc := range append(append(append(append(append(uncontendedCases(), defaultClientCases()...), replicaCases()...), contendedCases(cfg.goroutines)...), rateCases()...), hotCases()...) {
		if only.MatchString(bc.name) {
			cases = append(cases, bc)
		}
	}
	var replicated string // the master of the replicated cases
	for _, bc := range cases {
		if bc.replicated && replicated == "" {
			r, err := testutil.SpawnReplicated(1)
			if r != nil {
				defer r.Stop()
			}
			if err != nil {
				return fmt.Errorf("%s needs a master and a replica: %w", bc.name, err)
			}
			replicated = r.Master.Addr
			fmt.Fprintf(os.Stderr, "bench: master pid %d on %s, replica pid %d, for %s\n", r.Master.Pid(), r.Master.Addr, r.Replicas[0].Pid(), bc.name)
		}
	}
	var sums []summary
	ping := map[bool]float64{}
	for _, bc := range cases {
		samples := make([][]sample, len(bc.subjects))
		addr := cfg.addr
		if bc.replicated {
			addr = replicated
		}
		for round := range cfg.rounds { // A B A B ...
			for i, sub := range bc.subjects {
				s, err := measure(ctx, addr, cfg.goroutines, cfg.duration, sub.prepare)
				if err != nil {
					return fmt.Errorf("%s, %s, round %d: %w", bc.name, sub.lib, round+1, err)
				}
				samples[i] = append(samples[i], s)
			}
		}
		for i, sub := range bc.subjects {
			s := summarize(bc.name, sub.lib, samples[i])
			if bc.name == pingSerial || bc.name == pingParallel {
				ping[bc.parallel] = s.OpsPerSec
			}
			s.XPing = s.OpsPerSec / ping[bc.parallel]
			sums = append(sums, s)
			fmt.Fprintf(os.Stderr, "bench: %-45s %-14s %9.0f ops/s  %5.2f×PING  %5.2f cmds/op  %4.0f allocs/op\n",
				s.Case, s.Lib, s.OpsPerSec, s.XPing, s.CmdsPerOp, s.AllocsPerOp)
		}
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
