package main

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// errGaveUp is returned by an operation whose wait ended without acquiring
// (a contended lock whose retries or context ran out): not counted as an
// operation, not fatal.
var errGaveUp = errors.New("gave up")

// An env is what one round of one library gets: the server, a key prefix of
// its own, and the clients it made (counted and closed by the runner).
type env struct {
	addr       string
	prefix     string // unique per round, ends in ':'
	goroutines int    // the -goroutines flag

	mu      sync.Mutex
	clients []*redis.Client
	hooks   []*counter
	closers []func() error // clients of other go-redis versions (asynq's v8)
}

// client returns a new client with a command counter, and a pool large
// enough for every goroutine of a parallel case.
func (e *env) client() *redis.Client {
	// Deadlines honoured by go-redis: the client a user should build.
	return e.add(redis.NewClient(&redis.Options{Addr: e.addr, PoolSize: e.goroutines + 16, ContextTimeoutEnabled: true}))
}

// defaultClient is client with go-redis's defaults: deadlines not honoured.
func (e *env) defaultClient() *redis.Client {
	return e.add(redis.NewClient(&redis.Options{Addr: e.addr, PoolSize: e.goroutines + 16}))
}

// add counts c's commands and has the runner close it.
func (e *env) add(c *redis.Client) *redis.Client {
	h := &counter{}
	c.AddHook(h)
	e.mu.Lock()
	e.clients = append(e.clients, c)
	e.hooks = append(e.hooks, h)
	e.mu.Unlock()
	return c
}

// cmds is the number of commands all of the env's clients sent so far.
func (e *env) cmds() int64 {
	var n int64
	for _, h := range e.hooks {
		n += h.cmds.Load()
	}
	return n
}

// addCounted has the runner count a client of another go-redis version
// through h (a hook of that version on h.cmds) and close it.
func (e *env) addCounted(h *counter, closer func() error) {
	e.mu.Lock()
	e.hooks = append(e.hooks, h)
	e.closers = append(e.closers, closer)
	e.mu.Unlock()
}

// close closes the clients and deletes every key of the round's prefix
// (redis_rate's keys start with "rate:" before it, asynq's semaphores'
// with "asynq:sema:").
func (e *env) close(ctx context.Context) {
	if len(e.clients) > 0 {
		for _, before := range []string{"", "rate:", asynqSemaPrefix} {
			deletePrefix(ctx, e.clients[0], before+e.prefix)
		}
	}
	for _, c := range e.clients {
		_ = c.Close()
	}
	for _, c := range e.closers {
		_ = c()
	}
}

// deletePrefix unlinks every key that starts with prefix.
func deletePrefix(ctx context.Context, c *redis.Client, prefix string) {
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Unlink(ctx, iter.Val())
	}
}

// A workload is a prepared library: goroutines run op in a loop. op gets
// the round's context (done when the duration is over), the goroutine's
// index and its per-goroutine sequence number.
type workload struct {
	goroutines int
	op         func(ctx context.Context, g, i int) error
	// after, if set, runs once the round is over; its error fails the
	// round (a check over all of the round's calls, such as a count of
	// denials that should be 0).
	after func() error
}

// A sample is one round of one library.
type sample struct {
	ops     int64
	gaveUp  int64
	elapsed time.Duration
	mallocs uint64
	cmds    int64
	server  serverStats // INFO commandstats deltas over the round
}

// perSec is operations per second.
func (s sample) perSec() float64 { return float64(s.ops) / s.elapsed.Seconds() }

// roundSeq numbers rounds, for unique prefixes.
var roundSeq atomic.Int64

// measure prepares a workload with a fresh env, runs it for d and returns
// the sample. Setup (prepare) is neither timed nor counted.
func measure(ctx context.Context, addr string, goroutines int, d time.Duration, prepare func(context.Context, *env) (workload, error)) (sample, error) {
	e := newEnv(addr, goroutines)
	defer e.close(context.WithoutCancel(ctx))
	w, err := prepare(ctx, e)
	if err != nil {
		return sample{}, err
	}
	runtime.GC()
	s, err := timed(ctx, e, func() (int64, int64, time.Duration, error) { return loop(ctx, w, d) })
	if err != nil {
		return sample{}, err
	}
	return s, finish(w, s, d)
}

// timed runs run, which times calls made on e's clients, and returns its
// sample: its counts and time, and what the process allocated, the clients
// sent and Redis did meanwhile.
func timed(ctx context.Context, e *env, run func() (ops, gaveUp int64, elapsed time.Duration, err error)) (sample, error) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cmds0 := e.cmds()
	server0 := readServerStats(ctx, e.clients[0])
	ops, gaveUp, elapsed, err := run()
	runtime.ReadMemStats(&after)
	if err != nil {
		return sample{}, err
	}
	return sample{
		ops:     ops,
		gaveUp:  gaveUp,
		elapsed: elapsed,
		mallocs: after.Mallocs - before.Mallocs,
		cmds:    e.cmds() - cmds0,
		server:  readServerStats(ctx, e.clients[0]).minus(server0),
	}, nil
}

// loop runs w's goroutines for d and counts the operations that completed
// within d; the first error of an operation ends the round early.
func loop(ctx context.Context, w workload, d time.Duration) (ops, gaveUp int64, elapsed time.Duration, err error) {
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	end, _ := rctx.Deadline()
	var nOps, nGaveUp atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	start := time.Now()
	for g := range w.goroutines {
		wg.Go(func() {
			var n, gu int64
			for i := 0; rctx.Err() == nil; i++ {
				opErr := w.op(rctx, g, i)
				switch {
				case rctx.Err() != nil, !time.Now().Before(end):
					// The round ended during the call (a call's own timer
					// for the same deadline may fire before rctx's).
				case opErr == nil:
					n++
				case errors.Is(opErr, errGaveUp):
					gu++
				default:
					errOnce.Do(func() { err = opErr; cancel() })
				}
			}
			nOps.Add(n)
			nGaveUp.Add(gu)
		})
	}
	wg.Wait()
	return nOps.Load(), nGaveUp.Load(), time.Since(start), err
}

// newEnv is a fresh env on addr with a key prefix of its own.
func newEnv(addr string, goroutines int) *env {
	return &env{
		addr:       addr,
		prefix:     "fgbench:" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(roundSeq.Add(1), 10) + ":",
		goroutines: goroutines,
	}
}
