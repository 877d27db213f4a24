package mutex_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// counter is a go-redis hook that counts the commands a client sends, and
// the script runs among them by the first words of their source's comment.
type counter struct {
	cmds    atomic.Int64 // commands sent
	extends atomic.Int64 // extend scripts sent
	evals   atomic.Int64 // scripts answered without error (NOSCRIPT retries not counted)
	sets    atomic.Int64 // native SETs answered without error (TryLock, Lock's first attempt)
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		err := next(ctx, cmd)
		if err == nil && strings.HasPrefix(strings.ToLower(cmd.Name()), "eval") {
			c.evals.Add(1)
		}
		if (err == nil || err == redis.Nil) && strings.EqualFold(cmd.Name(), "set") {
			c.sets.Add(1)
		}
		return err
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *counter) count(cmd redis.Cmder) {
	c.cmds.Add(1)
	// EVALSHA carries no source; extend is the only script with 1 key and
	// 3 arguments.
	args := cmd.Args()
	name := strings.ToLower(cmd.Name())
	if (name == "evalsha" || name == "eval") && len(args) == 7 && fmt.Sprint(args[2]) == "1" {
		c.extends.Add(1)
	}
}
