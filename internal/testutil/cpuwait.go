package testutil

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// CPUWaits returns how long each thread of the process pid ("self" for this
// one) has waited for a CPU, runnable but not running, from Linux's
// /proc/<pid>/task/<tid>/schedstat; nil where that is not available. A call
// that took longer than its deadline by about the longest wait between two
// readings (Starved) was late because its process did not run: a loaded
// machine, not a blocked call.
func CPUWaits(pid string) map[string]time.Duration {
	tasks, err := os.ReadDir("/proc/" + pid + "/task")
	if err != nil {
		return nil
	}
	waits := make(map[string]time.Duration, len(tasks))
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/" + pid + "/task/" + task.Name() + "/schedstat")
		if err != nil {
			continue // the thread has ended
		}
		// Time on a CPU, time waiting on a run queue (ns), time slices.
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			waits[task.Name()] = time.Duration(ns)
		}
	}
	return waits
}

// Starved returns the longest a thread waited for a CPU between two
// readings of CPUWaits.
func Starved(before, after map[string]time.Duration) time.Duration {
	var worst time.Duration
	for tid, w := range after {
		worst = max(worst, w-before[tid])
	}
	return worst
}
