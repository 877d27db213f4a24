package main

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// counter is a go-redis hook that counts every command a client sends,
// pipelined ones included. Pub/Sub connections do not pass through process
// hooks, so SUBSCRIBE traffic is not counted.
type counter struct {
	cmds atomic.Int64
}

// DialHook passes dials through.
func (c *counter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

// ProcessHook counts one command.
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.cmds.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts every command of a pipeline.
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
