package mutex

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// WithReplicaAck makes every write that grants or keeps a lock wait until at
// least n replicas of the key's master have acknowledged it, for at most
// timeout (Redis's WAIT, on the connection that made the write). The writes
// are acquisitions, extensions (Extend and AutoRenew), hand-overs in Redis,
// and releases that run a Fragment (UnlockWith, the funnel's commit); a
// plain release is not waited for: losing it costs only the rest of the
// lease.
//
// A plain acquisition sends WAIT in the same round trip as its script; an
// acquisition with a Fragment sends it only once the lock is granted (a gate
// that declines costs one round trip, as without the option), so that call
// takes two. What happens when fewer than n replicas acknowledge:
//   - an acquisition is undone (the lock released) and fails with
//     ErrNotReplicated; a waiting Lock returns that error at once;
//   - Extend fails with ErrNotReplicated; the lock keeps its new lease on the
//     master, but the handle counts on the old one;
//   - a hand-over to a waiter of this Locker is undone and the waiter tries
//     again; the release itself stands;
//   - UnlockWith fails with ErrNotReplicated: the lock is released and the
//     fragment's write stands on the master.
//
// The guarantee: a lock this Locker reports held, and a fragment's write it
// reports done, were on at least n replicas. Replication is still
// asynchronous: a failover that promotes a replica which was not among the
// acknowledgers loses them all the same (with Sentinel, n of at least half
// the replicas, and min-replicas-to-write on the master, narrow that
// window), and WAIT does not make Redis a consensus system.
//
// It needs a client whose connections can be held: *redis.Client (also from
// NewFailoverClient) or *redis.ClusterClient (the WAIT goes to the master of
// the key's slot); New refuses any other client, a Ring among them, with
// ErrUnsupported. Keep timeout below the client's ReadTimeout. n must be at
// least 1 and timeout at least a millisecond (ErrInvalid).
//
// It is an Option of New only: each node of a quorum is its own master.
func WithReplicaAck(n int, timeout time.Duration) Option {
	return lockerOption(func(l *Locker) error {
		switch {
		case n < 1 || n > math.MaxInt32:
			return fmt.Errorf("%w: replica acknowledgement by %d replicas: want at least 1", ErrInvalid, n)
		case timeout < time.Millisecond:
			return fmt.Errorf("%w: replica acknowledgement within %v: want at least 1ms", ErrInvalid, timeout)
		}
		l.acks, l.ackTimeout = n, timeout
		return nil
	})
}

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
// write's connection. The client's type is only known at run time, so this
// is New's error, not the compiler's.
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

// nodeOf returns the client of the master that holds key.
func (l *Locker) nodeOf(ctx context.Context, key string) (node, error) {
	if m, ok := l.client.(masters); ok {
		return m.MasterForKey(ctx, key)
	}
	return l.client.(node), nil
}

// acked is a script's reply with what its WAIT found: short is nil when
// enough replicas acknowledged the script's writes, else an error matching
// ErrNotReplicated.
type acked struct {
	reply any
	short error
}

// runAcked is run followed, in the same round trip, by WAIT; short is nil
// when the Locker waits for no replica. The script's own error (NOSCRIPT
// aside: the script is sent again, once) comes as err.
func (l *Locker) runAcked(ctx context.Context, script *redis.Script, keys []string, args []any, late func(any, error)) (reply any, short, err error) {
	if l.acks == 0 {
		reply, err = l.run(ctx, script, keys, args, late)
		return reply, nil, err
	}
	a, err := ctxcall.Do(ctx, l.runner.Workers(ctx), func(ctx context.Context) (acked, error) {
		return l.pipeWait(ctx, script, keys, args)
	}, lateReply(late))
	return a.reply, a.short, reach.Mark(err)
}

// pipeWait sends script and WAIT in one pipeline on the master of keys[0].
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
		// After a NOSCRIPT, the first WAIT may have used the bound up: the
		// second gets what is left of it (at least a millisecond).
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

// runThenWait runs script on one connection of the master of keys[0] and,
// when granted reports that its reply grants something, sends WAIT on that
// connection: a reply that grants nothing costs no wait.
func (l *Locker) runThenWait(ctx context.Context, script *redis.Script, keys []string, args []any, granted func(any) bool, late func(any, error)) (reply any, short, err error) {
	a, err := ctxcall.Do(ctx, l.runner.Workers(ctx), func(ctx context.Context) (acked, error) {
		n, err := l.nodeOf(ctx, keys[0])
		if err != nil {
			return acked{}, err
		}
		c := n.Conn()
		defer c.Close()
		reply, err := script.Run(ctx, c, keys, args...).Result()
		if err != nil || !granted(reply) {
			return acked{reply: reply}, err
		}
		wait := l.waitCmd(ctx, l.ackTimeout)
		_ = c.Process(ctx, wait)
		return acked{reply, l.short(wait)}, nil
	}, lateReply(late))
	return a.reply, a.short, reach.Mark(err)
}

// lateReply hands the script's reply of a late acked outcome to late (nil:
// nothing to do with it).
func lateReply(late func(any, error)) func(acked, error) {
	if late == nil {
		return nil
	}
	return func(a acked, err error) { late(a.reply, err) }
}

// waitCmd returns the WAIT command of the Locker's acknowledgement, bounded
// by d (at least a millisecond: WAIT's 0 would wait forever).
func (l *Locker) waitCmd(ctx context.Context, d time.Duration) *redis.IntCmd {
	return redis.NewIntCmd(ctx, "wait", l.acks, max(d.Milliseconds(), 1))
}

// short reads WAIT's reply: nil when enough replicas acknowledged.
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
