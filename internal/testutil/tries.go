package testutil

import (
	"os"
	"strconv"
	"syscall"
	"testing"
)

// TriesEnv names the variable that sets how many times the paused-Redis
// tests of failed calls try each path (Tries); 100 when unset.
const TriesEnv = "FUNNELGUARD_FAILED_CALL_TRIES"

// Tries returns how many times a paused-Redis test tries each path: the
// value of TriesEnv, or 100. A value that is not a positive integer fails t.
func Tries(t testing.TB) int {
	t.Helper()
	s := os.Getenv(TriesEnv)
	if s == "" {
		return 100
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", TriesEnv, s)
	}
	return n
}

// A Stopper stops and continues one process with SIGSTOP and SIGCONT from
// any goroutine (Freeze calls t.Fatal, which only the test's goroutine may):
// a redis-server paused at a chosen point of a call, such as a hook that
// runs between a read and its write. Pass only the pid of a process the
// test started.
type Stopper struct{ pid int }

// NewStopper returns a Stopper of pid, which continues the process when t
// ends, whatever happened.
func NewStopper(t testing.TB, pid int) *Stopper {
	s := &Stopper{pid: pid}
	t.Cleanup(s.Cont)
	return s
}

// Stop stops the process; the error is the kill's.
func (s *Stopper) Stop() error { return syscall.Kill(s.pid, syscall.SIGSTOP) }

// Cont continues the process (a running one is left as it is).
func (s *Stopper) Cont() { _ = syscall.Kill(s.pid, syscall.SIGCONT) }
