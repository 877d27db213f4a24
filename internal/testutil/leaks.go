package testutil

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"time"
)

// harness names a frame of the goroutines a test binary runs by itself:
// the test runner and its parked tests, signal handling, the fuzz
// coordinator. A goroutine with one of them on its stack is no leak.
var harness = []string{
	"testing.RunTests(", "testing.(*T).Run(", "testing.(*M).Run(", "testing.(*T).Parallel(",
	"testing.(*F).Fuzz(", "testing.runFuzzing(", "testing.runFuzzTests(",
	"os/signal.signal_recv(", "os/signal.loop(", "runtime.ensureSigM(",
}

// Leaks returns the goroutines other than the caller's and the test
// harness's, asked again until none is left or within has passed: a
// goroutine that ends a moment after a test (a release that outlives its
// call, a pool's closing reader) is not a leak; one still running then is.
// It is what goleak.Find does, written here so that the library's module
// requires no leak detector.
func Leaks(within time.Duration) error {
	deadline := time.Now().Add(within)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		left := others()
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d goroutines still running after %s:\n\n%s", len(left), within, strings.Join(left, "\n\n"))
		}
		time.Sleep(wait)
	}
}

// others returns the stacks of every goroutine but the caller's and the
// harness's.
func others() []string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	// The caller's stack comes first (runtime.Stack prints its own
	// goroutine before the others).
	for i, g := range bytes.Split(buf, []byte("\n\n")) {
		s := string(g)
		if i == 0 || s == "" || isHarness(s) {
			continue
		}
		out = append(out, s)
	}
	return out
}

func isHarness(stack string) bool {
	for _, f := range harness {
		if strings.Contains(stack, f) {
			return true
		}
	}
	return false
}
