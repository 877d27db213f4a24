package testutil

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// shared is the one real server of a test binary, started on first use and
// stopped by Main.
var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// atExit holds the stop functions of what is started once per test binary
// besides the shared server (the cluster, the sentinel group); Main runs them.
var atExit struct {
	mu    sync.Mutex
	stops []func()
}

// stopAtExit makes Main run stop after the tests, newest first.
func stopAtExit(stop func()) {
	atExit.mu.Lock()
	defer atExit.mu.Unlock()
	atExit.stops = append(atExit.stops, stop)
}

// stopAll runs and forgets the functions of stopAtExit, newest first.
func stopAll() {
	atExit.mu.Lock()
	stops := atExit.stops
	atExit.stops = nil
	atExit.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
}

// Real returns the test binary's shared real server, starting it on first
// use; it skips t without the server binary (or fails it, see NeedServer).
func Real(t testing.TB) *Server {
	t.Helper()
	NeedServer(t)
	shared.once.Do(func() {
		if serverPath() == "" {
			shared.err = serverBin.err()
			return
		}
		shared.srv, shared.err = Spawn()
	})
	if shared.err != nil {
		t.Fatalf("shared %s: %v", ServerName(), shared.err)
	}
	return shared.srv
}

// Main runs a package's tests, then each of after (a package's own
// clean-up), stops the shared server (and the cluster and sentinel group, if
// a test started them), and fails the binary when goroutines are left
// running. Call it from TestMain:
//
//	func TestMain(m *testing.M) { testutil.Main(m) }
func Main(m *testing.M, after ...func()) {
	// go-redis logs every failed dial; tests that stop servers make many.
	redis.SetLogger(quietLogger{})
	code := m.Run()
	for _, f := range after {
		f()
	}
	if shared.srv != nil {
		shared.srv.Stop()
	}
	stopAll()
	if code == 0 {
		if err := findLeaks(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// findLeaks is Leaks for up to 3 s: a release that outlives its call
// (funnel's after a call whose time ran out, mutex's of an abandoned
// attempt) is bounded by 2 s and may still wait for a server a test
// stopped. A goroutine still running after that is a leak.
func findLeaks() error { return Leaks(3 * time.Second) }
