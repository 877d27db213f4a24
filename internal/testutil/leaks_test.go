package testutil_test

import (
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

// parkedForLeakTest blocks until stop is closed: the leak Leaks must name.
func parkedForLeakTest(stop chan struct{}) { <-stop }

// TestLeaksFindsAGoroutineLeft: a goroutine left running is reported with
// its stack; once it ends, it is not. (The package's other tests leave
// their shared servers' goroutines running until TestMain's end, so only
// this one goroutine is looked for.)
func TestLeaksFindsAGoroutineLeft(t *testing.T) {
	stop := make(chan struct{})
	go parkedForLeakTest(stop)
	err := testutil.Leaks(50 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "parkedForLeakTest") {
		t.Fatalf("a parked goroutine: Leaks = %v", err)
	}
	close(stop)
	if err := testutil.Leaks(200 * time.Millisecond); err != nil && strings.Contains(err.Error(), "parkedForLeakTest") {
		t.Fatalf("after it ended: %v", err)
	}
}
