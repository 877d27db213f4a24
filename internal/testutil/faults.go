package testutil

import (
	"context"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Freeze stops the process pid with SIGSTOP: a stalled server (a
// swapping host, a frozen VM) or a paused client (a GC pause). It returns a
// function that continues the process with SIGCONT; that also runs when t
// ends, whatever happened, so no process stays stopped. Pass only the pid of
// a process the test started (Server.Pid, a helper process).
func Freeze(t testing.TB, pid int) (thaw func()) {
	t.Helper()
	var once sync.Once
	thaw = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(thaw) // before the stop: a failure below still continues it
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %d: %v", pid, err)
	}
	return thaw
}

// PauseClients sends CLIENT PAUSE <d> <mode> ("ALL" or "WRITE") through c:
// the server holds every normal client's commands (mode ALL) or its writes
// and scripts (mode WRITE) for d, on its own clock, and stops expiring keys
// meanwhile. A pause in mode WRITE is lifted with CLIENT UNPAUSE when t ends
// if it is still on; one in mode ALL blocks that command too, so it simply
// runs out.
func PauseClients(t testing.TB, c *redis.Client, d time.Duration, mode string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Do(ctx, "CLIENT", "PAUSE", strconv.FormatInt(d.Milliseconds(), 10), mode).Err(); err != nil {
		t.Fatalf("CLIENT PAUSE %v %s: %v", d, mode, err)
	}
	if mode == "WRITE" {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = c.Do(ctx, "CLIENT", "UNPAUSE").Err()
		})
	}
}
