package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/redis/go-redis/v9"
)

// A subject is one library in a case: prepare builds its clients in a fresh
// env and returns the workload to time.
type subject struct {
	lib     string
	prepare func(context.Context, *env) (workload, error)
}

// A benchCase compares libraries on one traffic pattern.
type benchCase struct {
	name     string
	parallel bool // compared with PING parallel; otherwise with PING serial
	// replicated runs the case on a master of its own with one replica in
	// sync (spawned for it), not on the shared server.
	replicated bool
	// serverCmds reports the Redis commands run per op, those called from
	// scripts included, and the script calls per op (INFO commandstats).
	serverCmds bool
	// ref, if set, is the library whose ops/s the others' are reported
	// over (a subject's lib).
	ref string
	// procs > 0 runs each subject in that many processes of this binary
	// at once, -goroutines/procs goroutines each (workers.go): the
	// subjects' prepare is nil, workerSubject has it.
	procs int
	// measure, if set, runs each round of each subject (lib) instead of
	// the goroutine loop (the subjects' prepare is nil): a case whose
	// set-up must happen inside the round, outside its timed window.
	measure func(ctx context.Context, addr, lib string, d time.Duration) (sample, error)
	// turns has the subjects take turns within each round (interleave.go):
	// for cases whose calls are short and independent, so that the end of a
	// turn leaves no wait behind.
	turns    bool
	subjects []subject
}

// Names of the PING cases, the reference of every ×PING column.
const (
	pingSerial   = "PING serial"
	pingParallel = "PING parallel"
	// twoEmptyScripts is not a PING case: it is measured against PING serial.
	twoEmptyScripts = "2 empty scripts serial (floor of a 2-script admission)"
)

// pingCases are the round-trip floor of the same server and client setup.
func pingCases() []benchCase {
	ping := func(parallel bool) subject {
		return subject{lib: "PING", prepare: func(_ context.Context, e *env) (workload, error) {
			c := e.client()
			return workload{goroutines: width(e, parallel), op: func(ctx context.Context, _, _ int) error {
				return c.Ping(ctx).Err()
			}}, nil
		}}
	}
	// Two round trips of a script that does nothing: the floor of any
	// admission made of two script calls, as funnelguard's is by design.
	empty := redis.NewScript("return 1")
	twoScripts := subject{lib: "PING", prepare: func(ctx context.Context, e *env) (workload, error) {
		c := e.client()
		if err := empty.Load(ctx, c).Err(); err != nil {
			return workload{}, err
		}
		return workload{goroutines: 1, op: func(ctx context.Context, _, _ int) error {
			if err := empty.Run(ctx, c, nil).Err(); err != nil {
				return err
			}
			return empty.Run(ctx, c, nil).Err()
		}}, nil
	}}
	return []benchCase{
		{name: pingSerial, subjects: []subject{ping(false)}},
		{name: pingParallel, parallel: true, subjects: []subject{ping(true)}},
		{name: twoEmptyScripts, subjects: []subject{twoScripts}},
	}
}

// width is the number of goroutines of a serial or parallel case.
func width(e *env, parallel bool) int {
	if parallel {
		return e.goroutines
	}
	return 1
}

// newToken returns 128 random bits in hex, as a lock owner's token.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
