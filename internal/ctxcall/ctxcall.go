package ctxcall

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Honours reports whether client is known to bound its commands by their
// context's deadline: a go-redis Client, ClusterClient or Ring made with
// ContextTimeoutEnabled and no negative read or write timeout (go-redis then
// sets no deadline on the socket at all). Anything else (another client
// type, a wrapper) is taken not to.
func Honours(client any) bool {
	switch c := client.(type) {
	case interface{ Options() *redis.Options }:
		o := c.Options()
		return bounds(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	case interface{ Options() *redis.ClusterOptions }:
		o := c.Options()
		return bounds(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	case interface{ Options() *redis.RingOptions }:
		o := c.Options()
		return bounds(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	}
	return false
}

// bounds reports whether go-redis bounds a socket read and write by the
// context's deadline under these options.
func bounds(enabled bool, read, write time.Duration) bool {
	return enabled && read >= 0 && write >= 0
}

// Do returns f(ctx). When w is not nil (Runner.Workers: the client does not
// bound f by ctx's end) and ctx can end, f runs in one of w's goroutines and
// Do returns when ctx ends, if that comes first, with an error matching
// ErrAbandoned and ctx.Err(); late, if not nil, then receives f's outcome
// when it arrives (to undo what f did, for example), in that goroutine.
func Do[T any](ctx context.Context, w *Workers, f func(context.Context) (T, error), late func(T, error)) (T, error) {
	if w == nil || ctx.Done() == nil {
		v, err := f(ctx)
		return v, settled(ctx, err)
	}
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	h := &handoff[T]{ctx: ctx, f: f, late: late, done: make(chan struct{})}
	w.run(h)
	select {
	case <-h.done:
	case <-ctx.Done():
		if h.claimed.CompareAndSwap(false, true) {
			return zero, fmt.Errorf("%w: %w", ErrAbandoned, ctx.Err())
		}
		<-h.done // both ready: the outcome is known, so report it
	}
	return h.v, settled(ctx, h.err)
}

// A handoff is one call of Do in a worker, one allocation with its
// channel. Its outcome goes either to the caller (done closed) or, once the
// caller has left, to late: never both, never neither.
type handoff[T any] struct {
	ctx     context.Context
	f       func(context.Context) (T, error)
	late    func(T, error)
	claimed atomic.Bool // by the first of the worker (delivering) and the caller (leaving)
	done    chan struct{}
	v       T
	err     error
}

func (h *handoff[T]) run() {
	h.v, h.err = h.f(h.ctx)
	if h.claimed.CompareAndSwap(false, true) {
		close(h.done)
	} else if h.late != nil {
		h.late(h.v, h.err)
	}
}

// ErrAbandoned is joined with ctx.Err() when Do returned before f did: f's
// outcome goes to late. A ctx cancelled before its deadline ends a call so
// on any client; a deadline does only on a client without
// ContextTimeoutEnabled, which the message names.
var ErrAbandoned = errors.New("outcome unknown: the call was abandoned at its context's end (a cancellation, or a deadline that the Redis client does not bound its commands by: set ContextTimeoutEnabled in its options)")

// TimedOut reports whether err is a time-out, context.DeadlineExceeded
// included. (Its own function, so that the target errors.As takes the
// address of is not allocated on the calls that have no error.)
func TimedOut(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// settled is err, f's error, joined with ctx's deadline error when it is a
// time-out and ctx's deadline has passed: go-redis's socket deadline (the
// context's deadline, ContextTimeoutEnabled) can fire before ctx's own
// timer runs on a loaded machine, and the caller must still see that its
// deadline ended the call.
func settled(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !TimedOut(err) {
		return err
	}
	if cerr := Ended(ctx); cerr != nil {
		return fmt.Errorf("%w: %w", err, cerr)
	}
	return err
}

// Ended returns ctx's error once ctx has ended or its deadline has passed
// (a deadline's timer may fire late on a loaded machine, and Err stays nil
// until it does), else nil.
func Ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// DeadlineOnly returns context.WithDeadline(parent, d), marked, when parent
// cannot end (parent.Done() is nil), as a context that only its deadline
// ends: a Runner on a client that honours deadlines then sends its commands
// from the caller's goroutine, with no hand-off. Its cancel function may
// still be called before the deadline by code that does not need the call
// to end at once (a refusal seen by an outage watch: the server is gone,
// and its connections with it).
func DeadlineOnly(parent context.Context, d time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithDeadline(parent, d)
	if parent.Done() != nil {
		return ctx, cancel
	}
	return deadlineOnly{ctx}, cancel
}

// deadlineOnly marks a context that only its deadline ends (DeadlineOnly).
type deadlineOnly struct{ context.Context }

// Runner runs scripts on a client so that each ends by its context's end,
// a cancellation included: from the caller's goroutine when that is enough
// (Direct), else under Do.
type Runner struct {
	scripter redis.Scripter
	workers  *Workers
	honours  bool // the client bounds commands by ctx's deadline (Honours)
}

// NewRunner returns the Runner of client. It starts no goroutine: its
// Workers start one at the first call handed to them.
func NewRunner(client redis.Scripter) Runner {
	return Runner{scripter: client, workers: NewWorkers(), honours: Honours(client)}
}

// Workers is what Do needs for a call under ctx on the client: nil when
// Direct(ctx).
func (r Runner) Workers(ctx context.Context) *Workers {
	if r.Direct(ctx) {
		return nil
	}
	return r.workers
}

// Scripter is the client to send a command on when Direct reports true.
func (r Runner) Scripter() redis.Scripter { return r.scripter }

// Direct reports whether a command sent on Scripter from the caller's
// goroutine ends by ctx's end: ctx cannot end, or the client honours
// deadlines and only ctx's deadline ends it (DeadlineOnly). A ctx that can
// be cancelled sooner hands the call off as on any client (see the package
// doc: go-redis never watches ctx.Done).
func (r Runner) Direct(ctx context.Context) bool {
	if ctx.Done() == nil {
		return true
	}
	_, timed := ctx.(deadlineOnly)
	return timed && r.honours
}

// Run runs script, from the caller's goroutine when Direct, else under Do
// with late.
func (r Runner) Run(ctx context.Context, script *redis.Script, keys []string, args []any, late func(any, error)) (any, error) {
	if r.Direct(ctx) {
		return script.Run(ctx, r.scripter, keys, args...).Result()
	}
	return Do(ctx, r.workers, func(ctx context.Context) (any, error) {
		return script.Run(ctx, r.scripter, keys, args...).Result()
	}, late)
}

// Idle is how long a worker goroutine waits for its next call before it
// ends (between Idle and twice Idle).
const Idle = 20 * time.Millisecond

// Workers hands calls to goroutines that outlast them briefly: a goroutine
// that ran a call waits about Idle for the next before it ends. A caller
// making calls one after another reuses one goroutine, and the stack go-redis
// grew on it, cheaper than a goroutine started for each call. Nothing runs
// once calls stop: the last worker ends at most twice Idle after its call.
// A nil *Workers runs calls from the caller's goroutine (Do).
type Workers struct {
	jobs chan job // unbuffered: a send succeeds only into an idle worker
}

// A job is a call handed to a worker (a *handoff).
type job interface{ run() }

// NewWorkers returns Workers with no goroutine yet.
func NewWorkers() *Workers { return &Workers{jobs: make(chan job)} }

// run has job run in a goroutine: an idle worker's, else a new one's.
func (w *Workers) run(j job) {
	select {
	case w.jobs <- j:
	default:
		go w.work(j)
	}
}

// work runs job, then each call handed to it, until a check finds it ran
// none since the one before. The checks come every Idle from a timer armed
// once (not a timer reset after every call, which costs each call).
func (w *Workers) work(j job) {
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
		j.run()
		ran.Add(1)
		select {
		case j = <-w.jobs:
		case <-quit:
			return
		}
	}
}
