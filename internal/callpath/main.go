package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/coverage"
	"strconv"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: callpath DIR (run internal/callpath/run.sh)")
	}
	addr, stop, err := startServer()
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	if err := measure(context.Background(), c, os.Args[1]); err != nil {
		stop()
		log.Fatal(err)
	}
}

// startServer runs redis-server on a free loopback port, without
// persistence, and returns its address and how to stop it (by its pid).
func startServer() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for i := 0; i < 100; i++ {
		if conn, err := net.Dial("tcp", addr); err == nil {
			conn.Close()
			return addr, stop, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	return "", nil, fmt.Errorf("redis-server on %s did not start", addr)
}

// step is one call to measure, with what must come before and after it.
type step struct {
	name                  string
	before, call, cleanup func() error
}

func measure(ctx context.Context, c *redis.Client, dir string) error {
	l, err := mutex.New(c)
	if err != nil {
		return err
	}
	sem, err := l.Semaphore("sem", 4)
	if err != nil {
		return err
	}
	lim, err := funnel.New(c)
	if err != nil {
		return err
	}
	other, err := funnel.New(c) // another process's Limiter
	if err != nil {
		return err
	}
	uniform, err := funnel.New(c, funnel.WithUniformCost()) // the lock path always
	if err != nil {
		return err
	}
	rule := funnel.AtMost(1_000_000, time.Hour)
	var lk *mutex.Lock
	var p *mutex.Permit
	fresh := 0
	steps := []step{
		{name: "Lock",
			call:    func() (err error) { lk, err = l.Lock(ctx, "lock"); return err },
			cleanup: func() error { return lk.Unlock(ctx) }},
		{name: "Unlock",
			before: func() (err error) { lk, err = l.Lock(ctx, "lock"); return err },
			call:   func() error { return lk.Unlock(ctx) }},
		{name: "SemaphoreAcquire",
			call:    func() (err error) { p, err = sem.Acquire(ctx, 1); return err },
			cleanup: func() error { return p.Release(ctx) }},
		{name: "AllowFresh",
			call: func() error { fresh++; _, err := lim.Allow(ctx, "fresh"+strconv.Itoa(fresh), rule); return err }},
		{name: "AllowReturning",
			call: func() error { _, err := lim.Allow(ctx, "returning", rule); return err }},
		{name: "AllowOther", // a key whose state another Limiter wrote last
			before: func() error { _, err := other.Allow(ctx, "shared", rule); return err },
			call:   func() error { _, err := lim.Allow(ctx, "shared", rule); return err }},
		{name: "AllowLocked", // through the key's lock
			call: func() error { _, err := uniform.Allow(ctx, "locked", rule); return err }},
	}
	for _, s := range steps {
		if err := run(s, filepath.Join(dir, s.name)); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

// run makes s's call three times and writes the counters of the last.
func run(s step, out string) error {
	for i := 0; i < 3; i++ {
		if s.before != nil {
			if err := s.before(); err != nil {
				return err
			}
		}
		if i == 2 {
			if err := coverage.ClearCounters(); err != nil {
				return err
			}
		}
		if err := s.call(); err != nil {
			return err
		}
		if i == 2 {
			if err := write(out); err != nil {
				return err
			}
		}
		if s.cleanup != nil {
			if err := s.cleanup(); err != nil {
				return err
			}
		}
	}
	return nil
}

func write(out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := coverage.WriteMetaDir(out); err != nil {
		return err
	}
	return coverage.WriteCountersDir(out)
}
