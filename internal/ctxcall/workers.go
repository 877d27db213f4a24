package ctxcall

import (
	"math"
	"sync/atomic"
	"time"
)

// Idle is how long a worker goroutine waits for its next call before it
// ends (between Idle and twice Idle).
const Idle = 20 * time.Millisecond

// Workers hands calls to goroutines that outlast them briefly: a goroutine
// that ran a call waits about Idle for the next before it ends. A caller
// making calls one after another reuses one goroutine, and the stack go-redis
// grew on it, where a goroutine started for each call costs about 3 µs more
// a call (SET NX then a compare-and-delete script on a loopback Redis,
// 100 ms turns over 20 s on a 2-core VM: 56 µs from the caller's goroutine,
// 64 µs handed to Workers, 70 µs to a new goroutine per call). Nothing runs
// once calls stop: the last worker ends at most twice Idle after its call.
//
// A nil *Workers stands for a call that needs no hand-off (Runner.Workers:
// its command ends by its context's end as it is): Do then runs it from the
// caller's goroutine.
type Workers struct {
	jobs chan func() // unbuffered: a send succeeds only into an idle worker
}

// NewWorkers returns Workers with no goroutine yet.
func NewWorkers() *Workers { return &Workers{jobs: make(chan func())} }

// run has job run in a goroutine: an idle worker's, else a new one's.
func (w *Workers) run(job func()) {
	select {
	case w.jobs <- job:
	default:
		go w.work(job)
	}
}

// work runs job, then each call handed to it, until a check finds it ran
// none since the one before. The checks come every Idle from a timer armed
// once (not a timer reset after every call, which costs each call).
func (w *Workers) work(job func()) {
	var ran atomic.Uint64
	quit := make(chan struct{})
	var seen uint64
	// Armed only once check is set: a timer that fired before the
	// assignment (a worker descheduled for Idle) would read it unset.
	var check *time.Timer
	check = time.AfterFunc(time.Duration(math.MaxInt64), func() {
		if n := ran.Load(); n != seen {
			seen = n
			check.Reset(Idle)
			return
		}
		close(quit)
	})
	check.Reset(Idle)
	for {
		job()
		ran.Add(1)
		select {
		case job = <-w.jobs:
		case <-quit:
			return
		}
	}
}
