package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
	subjects []subject
}

// Names of the PING cases, the reference of every ×PING column.
const (
	pingSerial   = "PING serial"
	pingParallel = "PING parallel"
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
	return []benchCase{
		{name: pingSerial, subjects: []subject{ping(false)}},
		{name: pingParallel, parallel: true, subjects: []subject{ping(true)}},
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
