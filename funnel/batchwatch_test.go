package funnel_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A batchWatch sees, from outside the Limiter, which calls of a test lead a
// batch and which wait in one. A call that joins a batch sends nothing to
// Redis, so no client hook can see it; its goroutine can be seen: it waits
// in funnel's (*waiter).wait, and a leader runs (*Limiter).lead. The watch
// reads the goroutine profile, and counts only the goroutines that carry
// its label: those started, directly or not, from the goroutine that made
// the watch after it did (labels are inherited), so that another test's
// goroutines, or a Limiter's own (a release finishing in the background,
// which runs neither function), never count. If funnel renames either
// function, the watch sees no call and the tests that wait on it fail
// (time out), they do not pass.
type batchWatch struct{ id string }

// The frames a batch's calls are seen by.
const (
	waitFrame = "/funnel.(*waiter).wait+"
	leadFrame = "/funnel.(*Limiter).lead+"
)

var watches atomic.Int64

// newBatchWatch labels the current goroutine, so that the goroutines it
// starts from now on are watched.
func newBatchWatch() *batchWatch {
	w := &batchWatch{id: strconv.FormatInt(watches.Add(1), 10)}
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("batchwatch", w.id)))
	return w
}

// labelCall labels the current goroutine, which the watch must see, as call
// i, for leaders to name.
func (w *batchWatch) labelCall(i int) {
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("batchwatch", w.id, "call", strconv.Itoa(i))))
}

// A batchView is what a watch saw at one moment: how many of its calls
// waited in a batch and how many led one, and the calls (labelCall) of
// each, by index.
type batchView struct {
	waiting, leading int
	waiters, leaders map[int]bool
}

// view reads the goroutine profile.
func (w *batchWatch) view() batchView {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		panic(err)
	}
	v := batchView{waiters: map[int]bool{}, leaders: map[int]bool{}}
	mine := fmt.Sprintf("%q:%q", "batchwatch", w.id)
	// After a header line, records: "<count> @ <pcs>", "# labels: {...}"
	// when labelled, then one "#\t<pc>\t<function>+<offset>\t<file>:<line>"
	// line a frame; a blank line ends each.
	_, body, _ := strings.Cut(buf.String(), "\n")
	for _, rec := range strings.Split(body, "\n\n") {
		lines := strings.Split(strings.TrimSpace(rec), "\n")
		if len(lines) < 2 || !strings.HasPrefix(lines[1], "# labels: ") {
			continue
		}
		labels := strings.TrimPrefix(lines[1], "# labels: ")
		if !strings.Contains(labels, mine) {
			continue
		}
		count, err := strconv.Atoi(strings.Fields(lines[0])[0])
		if err != nil {
			panic(fmt.Sprintf("goroutine profile record %q", lines[0]))
		}
		call := -1
		if _, after, ok := strings.Cut(labels, `"call":"`); ok {
			call, _ = strconv.Atoi(after[:strings.IndexByte(after, '"')])
		}
		stack := strings.Join(lines[2:], "\n")
		switch {
		case strings.Contains(stack, waitFrame):
			v.waiting += count
			if call >= 0 {
				v.waiters[call] = true
			}
		case strings.Contains(stack, leadFrame):
			v.leading += count
			if call >= 0 {
				v.leaders[call] = true
			}
		}
	}
	return v
}

// until polls the watch until cond holds of what it sees, for d at most, and
// returns the last view and whether cond held.
func (w *batchWatch) until(d time.Duration, cond func(v batchView) bool) (batchView, bool) {
	for deadline := time.Now().Add(d); ; {
		v := w.view()
		if cond(v) {
			return v, true
		}
		if time.Now().After(deadline) {
			return v, false
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// waiting waits up to d until n of the watched calls wait in a batch, and
// returns how many did (the most, n, once n do).
func (w *batchWatch) waiting(n int, d time.Duration) int {
	v, _ := w.until(d, func(v batchView) bool { return v.waiting >= n })
	return min(v.waiting, n)
}

// awaitJoins waits for n of the watched calls to wait in a batch led by
// another: a minute at most, a hang's bound, not a speed target.
func awaitJoins(t *testing.T, w *batchWatch, n int) {
	t.Helper()
	if got := w.waiting(n, time.Minute); got < n {
		t.Fatalf("%d of %d calls joined a batch", got, n)
	}
}

// awaitLeader waits for one of the watched calls to lead a batch: a minute
// at most, a hang's bound. A test that starts a call to lead, then others,
// waits so: the scheduler often runs the goroutine started last first.
func awaitLeader(t *testing.T, w *batchWatch) {
	t.Helper()
	if v, ok := w.until(time.Minute, func(v batchView) bool { return v.leading >= 1 }); !ok {
		t.Fatalf("no call leads a batch (%d wait in one)", v.waiting)
	}
}
