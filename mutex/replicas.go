package mutex

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ReplicaAck returns the replica acknowledgement the Locker waits for
// (WithReplicaAck): n is 0 when it waits for none.
func (l *Locker) ReplicaAck() (n int, timeout time.Duration) {
	if l == nil {
		return 0, 0
	}
	return l.acks, l.ackTimeout
}

// node is a client of one Redis server whose connections can be held:
// WAIT counts the replicas that have the writes of its own connection.
type node interface {
	Pipeline() redis.Pipeliner
	Conn() *redis.Conn
}

// masters finds the master of a key's slot (a ClusterClient).
type masters interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
}

// checkAcks refuses WithReplicaAck on a client that cannot tie WAIT to a
// write's connection.
func (l *Locker) checkAcks() error {
	if l.acks == 0 {
		return nil
	}
	switch l.client.(type) {
	case masters, node:
		return nil
	}
	return fmt.Errorf("%w: WithReplicaAck with a %T (it needs a *redis.Client or *redis.ClusterClient)", ErrUnsupported, l.client)
}

func (l *Locker) nodeOf(ctx context.Context, key string) (node, error) {
	if m, ok := l.client.(masters); ok {
		return m.MasterForKey(ctx, key)
	}
	return l.client.(node), nil
}

// acked is a script's reply and its WAIT's shortfall (nil: enough replicas).
type acked struct {
	reply any
	short error
}

func (l *Locker) pipeWait(ctx context.Context, script *redis.Script, keys []string, args []any) (acked, error) {
	start := time.Now()
	for load := false; ; load = true {
		n, err := l.nodeOf(ctx, keys[0])
		if err != nil {
			return acked{}, err
		}
		p := n.Pipeline()
		var cmd *redis.Cmd
		if load {
			cmd = script.Eval(ctx, p, keys, args...)
		} else {
			cmd = script.EvalSha(ctx, p, keys, args...)
		}
		// After a NOSCRIPT the second WAIT gets what is left of the bound.
		wait := l.waitCmd(ctx, l.ackTimeout-time.Since(start))
		_ = p.Process(ctx, wait)
		_, _ = p.Exec(ctx) // each command keeps its own error
		reply, err := cmd.Result()
		if !load && redis.HasErrorPrefix(err, "NOSCRIPT") {
			continue // a flushed script cache: once more, with the source
		}
		if err != nil {
			return acked{}, err
		}
		return acked{reply, l.short(wait)}, nil
	}
}

// runThenWait runs an acquire script on one connection of keys[0]'s master,
// then WAIT on it only if the lock was granted.
func (l *Locker) runThenWait(ctx context.Context, script *redis.Script, keys []string, args []any) (acked, error) {
	n, err := l.nodeOf(ctx, keys[0])
	if err != nil {
		return acked{}, err
	}
	c := n.Conn()
	defer c.Close()
	reply, err := script.Run(ctx, c, keys, args...).Result()
	if r, _, aerr := acquired(reply); err != nil || aerr != nil || r[0] != 1 {
		return acked{reply: reply}, err
	}
	wait := l.waitCmd(ctx, l.ackTimeout)
	_ = c.Process(ctx, wait)
	return acked{reply, l.short(wait)}, nil
}

// waitCmd returns the Locker's WAIT bounded by d (at least 1 ms: 0 waits forever).
func (l *Locker) waitCmd(ctx context.Context, d time.Duration) *redis.IntCmd {
	return redis.NewIntCmd(ctx, "wait", l.acks, max(d.Milliseconds(), 1))
}

func (l *Locker) short(wait *redis.IntCmd) error {
	got, err := wait.Result()
	switch {
	case err != nil:
		return fmt.Errorf("%w: WAIT failed: %w", ErrNotReplicated, err)
	case got < int64(l.acks):
		return fmt.Errorf("%w: %d of %d replicas acknowledged within %v", ErrNotReplicated, got, l.acks, l.ackTimeout)
	}
	return nil
}
