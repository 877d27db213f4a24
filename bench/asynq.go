package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	redisv8 "github.com/go-redis/redis/v8"
	"github.com/hibiken/asynq"
)

// asynqSemaPrefix starts the key of every asynq semaphore (rate.semaphoreKey:
// "asynq:sema:<scope>"); env.close deletes the round's.
const asynqSemaPrefix = "asynq:sema:"

// asynqConn is an asynq.RedisConnOpt whose client (go-redis v8, asynq's)
// counts its commands in the env, as env.client's do.
type asynqConn struct{ e *env }

// MakeRedisClient returns a new counted v8 client on the env's server.
func (o asynqConn) MakeRedisClient() any {
	c := redisv8.NewClient(&redisv8.Options{Addr: o.e.addr, PoolSize: o.e.goroutines + 16})
	h := &counter{}
	c.AddHook(counterV8{h})
	o.e.addCounted(h, c.Close)
	return c
}

// counterV8 is counter as a go-redis v8 hook.
type counterV8 struct{ c *counter }

// BeforeProcess counts one command.
func (h counterV8) BeforeProcess(ctx context.Context, _ redisv8.Cmder) (context.Context, error) {
	h.c.cmds.Add(1)
	return ctx, nil
}

// AfterProcess does nothing.
func (counterV8) AfterProcess(context.Context, redisv8.Cmder) error { return nil }

// BeforeProcessPipeline counts every command of a pipeline.
func (h counterV8) BeforeProcessPipeline(ctx context.Context, cmds []redisv8.Cmder) (context.Context, error) {
	h.c.cmds.Add(int64(len(cmds)))
	return ctx, nil
}

// AfterProcessPipeline does nothing.
func (counterV8) AfterProcessPipeline(context.Context, []redisv8.Cmder) error { return nil }

// asynqTasks holds task contexts made by a real asynq Server, one per
// goroutine of a case: asynq's semaphore takes its holder's identity from
// the task ID in a handler's context (internal/context, not constructible
// outside asynq), so the bench enqueues that many tasks once per case, and
// keeps each handler's context for its values (the task ID) only.
type asynqTasks struct {
	mu   sync.Mutex
	ctxs []context.Context
}

// get returns at least n task contexts, made on the env's server the first
// time (not timed: prepare runs before the round).
func (t *asynqTasks) get(ctx context.Context, e *env, n int) ([]context.Context, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ctxs) >= n {
		return t.ctxs, nil
	}
	ctxs, err := runTasks(ctx, e, n)
	if err != nil {
		return nil, fmt.Errorf("asynq task contexts: %w", err)
	}
	t.ctxs = ctxs
	return ctxs, nil
}

// runTasks enqueues n tasks on a queue of the round's own, processes them
// with an asynq Server whose handler keeps its context, shuts the server down
// and deletes the queue's keys.
func runTasks(ctx context.Context, e *env, n int) ([]context.Context, error) {
	opt := asynq.RedisClientOpt{Addr: e.addr}
	queue := e.prefix + "tasks"
	defer func() {
		c, bg := e.client(), context.WithoutCancel(ctx)
		deletePrefix(bg, c, "asynq:{"+queue+"}")
		_ = c.SRem(bg, "asynq:queues", queue).Err()
	}()
	client := asynq.NewClient(opt)
	defer client.Close()
	for i := range n {
		if _, err := client.EnqueueContext(ctx, asynq.NewTask("bench", []byte(strconv.Itoa(i))), asynq.Queue(queue)); err != nil {
			return nil, err
		}
	}
	got := make(chan context.Context, n)
	srv := asynq.NewServer(opt, asynq.Config{Queues: map[string]int{queue: 1}, LogLevel: asynq.ErrorLevel})
	if err := srv.Start(asynq.HandlerFunc(func(c context.Context, _ *asynq.Task) error {
		got <- c
		return nil
	})); err != nil {
		return nil, err
	}
	defer srv.Shutdown()
	wait, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	ctxs := make([]context.Context, 0, n)
	for len(ctxs) < n {
		select {
		case c := <-got:
			if _, ok := asynq.GetTaskID(c); !ok {
				return nil, errors.New("a handler's context has no task ID")
			}
			ctxs = append(ctxs, c)
		case <-wait.Done():
			return nil, fmt.Errorf("%d of %d tasks processed: %w", len(ctxs), n, wait.Err())
		}
	}
	return ctxs, nil
}

// taskCtx is a round's context (deadline, cancellation) with the values of
// an asynq task's context (its task ID).
type taskCtx struct {
	context.Context
	task context.Context
}

// Value looks key up in the task's context.
func (c taskCtx) Value(key any) any { return c.task.Value(key) }
