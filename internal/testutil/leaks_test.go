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
// its stack; once it ends, nothing is.
func TestLeaksFindsAGoroutineLeft(t *testing.T) {
	if err := testutil.Leaks(time.Second); err != nil {
		t.Fatalf("before: %v", err)
	}
	stop := make(chan struct{})
	go parkedForLeakTest(stop)
	err := testutil.Leaks(50 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "parkedForLeakTest") {
		t.Fatalf("a parked goroutine: Leaks = %v", err)
	}
	close(stop)
	if err := testutil.Leaks(time.Second); err != nil {
		t.Fatalf("after it ended: %v", err)
	}
}
