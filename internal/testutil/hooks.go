package testutil

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DelayHook returns a go-redis hook that delays every command by d (or until
// its context ends): a Redis too slow for the caller's timeouts.
func DelayHook(d time.Duration) redis.Hook { return delayHook(d) }

type delayHook time.Duration

func (h delayHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h delayHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h delayHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			for _, cmd := range cmds { // as go-redis does for a pipeline that failed
				cmd.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

func (h delayHook) wait(ctx context.Context) error {
	t := time.NewTimer(time.Duration(h))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// HoldHook returns a go-redis hook that holds every command until release is
// called or the command's context ends: a Redis that answers nothing in
// time, without a delay to pick. Unlike DelayHook it lets a test tell "the
// call returned before Redis answered" from "Redis was fast enough", and,
// once released, no held command outlives the test (goleak).
func HoldHook() (h redis.Hook, release func()) {
	hh := holdHook{open: make(chan struct{})}
	var once sync.Once
	return hh, func() { once.Do(func() { close(hh.open) }) }
}

type holdHook struct{ open chan struct{} }

func (h holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			for _, cmd := range cmds { // as go-redis does for a pipeline that failed
				cmd.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

func (h holdHook) wait(ctx context.Context) error {
	select {
	case <-h.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
