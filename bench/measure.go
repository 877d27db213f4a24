package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
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

// close closes the clients and deletes every key of the round's prefix
// (redis_rate's keys start with "rate:" before it).
func (e *env) close(ctx context.Context) {
	if len(e.clients) > 0 {
		deletePrefix(ctx, e.clients[0], e.prefix)
		deletePrefix(ctx, e.clients[0], "rate:"+e.prefix)
	}
	for _, c := range e.clients {
		_ = c.Close()
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
}

// A sample is one round of one library.
type sample struct {
	ops     int64
	gaveUp  int64
	elapsed time.Duration
	mallocs uint64
	cmds    int64
	usec    int64 // server time in commands (INFO commandstats usec delta)
}

// perSec is operations per second.
func (s sample) perSec() float64 { return float64(s.ops) / s.elapsed.Seconds() }

// roundSeq numbers rounds, for unique prefixes.
var roundSeq atomic.Int64

// measure prepares a workload with a fresh env, runs it for d and returns
// the sample. Setup (prepare) is neither timed nor counted.
func measure(ctx context.Context, addr string, goroutines int, d time.Duration, prepare func(context.Context, *env) (workload, error)) (sample, error) {
	e := &env{
		addr:       addr,
		prefix:     "fgbench:" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(roundSeq.Add(1), 10) + ":",
		goroutines: goroutines,
	}
	defer e.close(context.WithoutCancel(ctx))
	w, err := prepare(ctx, e)
	if err != nil {
		return sample{}, err
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cmds0 := e.cmds()
	usec0 := serverUsec(ctx, e.clients[0])

	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	end, _ := rctx.Deadline()
	var ops, gaveUp atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	start := time.Now()
	for g := range w.goroutines {
		wg.Go(func() {
			var n, gu int64
			for i := 0; rctx.Err() == nil; i++ {
				err := w.op(rctx, g, i)
				switch {
				case rctx.Err() != nil, !time.Now().Before(end):
					// The round ended during the call (a call's own timer
					// for the same deadline may fire before rctx's).
				case err == nil:
					n++
				case errors.Is(err, errGaveUp):
					gu++
				default:
					errOnce.Do(func() { firstErr = err; cancel() })
				}
			}
			ops.Add(n)
			gaveUp.Add(gu)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	if firstErr != nil {
		return sample{}, firstErr
	}
	if ops.Load() == 0 {
		return sample{}, fmt.Errorf("no operation completed in %v", d)
	}
	return sample{
		ops:     ops.Load(),
		gaveUp:  gaveUp.Load(),
		elapsed: elapsed,
		mallocs: after.Mallocs - before.Mallocs,
		cmds:    e.cmds() - cmds0,
		usec:    serverUsec(ctx, e.clients[0]) - usec0,
	}, nil
}

// serverUsec is the server's total time spent in commands so far, in µs,
// summed over INFO commandstats (0 if unavailable). The INFO call itself is
// sent on the env's first client and counted as one command.
func serverUsec(ctx context.Context, c *redis.Client) int64 {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(line, ",usec=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
	}
	return total
}
