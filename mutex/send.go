package mutex

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// Overlapping calls of a Locker share round trips (PROTOCOL.md,
// "Contention"). A call that leaves before its command was sent takes it out
// of the queue; one that leaves after gets an error of unknown outcome, and
// its reply goes to its late function.

// batchSlots is how many commands or pipelines of one Locker may be in
// flight at once; batchMax is the most commands one pipeline carries.
const (
	batchSlots = 4
	batchMax   = 256
)

// A batcher queues the commands of a Locker's overlapping calls.
type batcher struct {
	pipe func() redis.Pipeliner // nil: the client has no pipelines
	// fanOut: every command goes to one server, so an unreachable reply
	// fails the queued commands too (a cluster's other nodes may be up).
	fanOut bool
	mu     sync.Mutex
	busy   int // slots in use
	queue  []*queued
}

// A queued command, and what its caller is waiting for.
type queued struct {
	ctx context.Context
	// add queues the command on p; again, if not nil, its EVAL after NOSCRIPT.
	add, again func(p redis.Pipeliner) redis.Cmder
	late       func(redis.Cmder) // the reply of a call that left; may be nil
	cmd        redis.Cmder
	state      uint8 // under batcher.mu
	done       chan struct{}
	unsent     error // answered without being sent (failQueuedLocked)
}

const (
	waiting uint8 = iota
	sent
	left // the caller left after the command was sent
)

// alone takes a slot for a call that runs by itself (then free); false:
// queue.
func (b *batcher) alone() bool {
	if b.pipe == nil {
		return true
	}
	b.mu.Lock()
	ok := b.busy < batchSlots && len(b.queue) == 0
	if ok {
		b.busy++
	}
	b.mu.Unlock()
	return ok
}

// free gives back alone's slot, or sends what queued meanwhile with it.
func (b *batcher) free(err error) {
	if b.pipe == nil {
		return
	}
	b.mu.Lock()
	b.failQueuedLocked(err)
	if len(b.queue) == 0 {
		b.busy--
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	go b.drain()
}

func (b *batcher) do(q *queued) (redis.Cmder, error) {
	b.mu.Lock()
	q.done = make(chan struct{})
	b.queue = append(b.queue, q)
	if b.busy < batchSlots {
		b.busy++
		b.mu.Unlock()
		go b.drain()
	} else {
		b.mu.Unlock()
	}
	select {
	case <-q.done:
		return q.answer()
	case <-q.ctx.Done():
	}
	return b.leave(q)
}

func (q *queued) answer() (redis.Cmder, error) {
	if q.unsent != nil {
		return nil, q.unsent
	}
	if d, ok := q.ctx.Deadline(); !ok || q.cmd.Err() == nil || time.Now().Before(d) {
		return q.cmd, nil
	}
	// The pipeline ended at this call's deadline: report it as such.
	<-q.ctx.Done()
	return nil, fmt.Errorf("%w: %w", ctxcall.ErrAbandoned, q.ctx.Err())
}

// leave ends the wait of q, whose context ended: out of the queue if not
// sent, else marked left.
func (b *batcher) leave(q *queued) (redis.Cmder, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-q.done: // answered as the context ended
		return q.answer()
	default:
	}
	if q.state == waiting {
		b.queue = slices.DeleteFunc(b.queue, func(o *queued) bool { return o == q })
		return nil, q.ctx.Err() // never sent
	}
	q.state = left
	return nil, fmt.Errorf("%w: %w", ctxcall.ErrAbandoned, q.ctx.Err())
}

func (b *batcher) drain() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), batchMax)
		if n == 0 {
			b.busy--
			b.mu.Unlock()
			return
		}
		batch := slices.Clone(b.queue[:n])
		b.queue = append(b.queue[:0], b.queue[n:]...)
		for _, q := range batch {
			q.state = sent
		}
		b.mu.Unlock()
		b.send(batch)
	}
}

// send runs batch as one pipeline, then the EVALs after NOSCRIPT, and
// answers each caller.
func (b *batcher) send(batch []*queued) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	p := b.pipe()
	for _, q := range batch {
		q.cmd = q.add(p)
	}
	_, err := p.Exec(ctx) // each command keeps its own reply or error
	if reach.Unreachable(err) {
		b.mu.Lock()
		b.failQueuedLocked(err)
		b.mu.Unlock()
	}
	b.evalMissing(ctx, batch)
	b.answer(batch)
}

// failQueuedLocked answers every queued command with err, unsent, when err
// is unreachable and the batcher fans out.
func (b *batcher) failQueuedLocked(err error) {
	if len(b.queue) == 0 || !b.fanOut || !reach.Unreachable(err) {
		return
	}
	err = reach.Mark(err)
	for _, q := range b.queue {
		q.unsent, q.state = err, sent
		close(q.done)
	}
	clear(b.queue)
	b.queue = b.queue[:0]
}

func (b *batcher) evalMissing(ctx context.Context, batch []*queued) {
	var p redis.Pipeliner
	for _, q := range batch {
		if q.again == nil || !redis.HasErrorPrefix(q.cmd.Err(), "NOSCRIPT") {
			continue
		}
		if p == nil {
			p = b.pipe()
		}
		q.cmd = q.again(p)
	}
	if p != nil {
		_, _ = p.Exec(ctx)
	}
}

// answer wakes each caller of batch, and runs the late function of each that
// left in a goroutine: one may call the Locker again (it would queue behind
// itself on this slot) or wait long.
func (b *batcher) answer(batch []*queued) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, q := range batch {
		switch {
		case q.state != left:
			close(q.done)
		case q.late != nil:
			go q.late(q.cmd)
		}
	}
}

// batchContext bounds a pipeline by the latest deadline of its calls (none
// if one has none), with the first call's values (hooks may read them).
func batchContext(batch []*queued) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, q := range batch {
		d, ok := q.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(batch[0].ctx))
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), latest)
}

// run runs script, returning by ctx's deadline even when the client
// ignores it (ctxcall); late, if not nil, gets a reply after the caller left.
func (l *Locker) run(ctx context.Context, script *redis.Script, keys []string, args []any, late func(any, error)) (any, error) {
	if l.batch.alone() {
		reply, err := l.runner.Run(ctx, script, keys, args, late)
		l.batch.free(err)
		return reply, marked(err)
	}
	q := &queued{
		ctx:   ctx,
		add:   func(p redis.Pipeliner) redis.Cmder { return script.EvalSha(ctx, p, keys, args...) },
		again: func(p redis.Pipeliner) redis.Cmder { return script.Eval(ctx, p, keys, args...) },
	}
	if late != nil {
		q.late = func(c redis.Cmder) { late(c.(*redis.Cmd).Result()) }
	}
	cmd, err := l.batch.do(q)
	if err != nil {
		return nil, err
	}
	reply, err := cmd.(*redis.Cmd).Result()
	return reply, marked(err)
}

// marked is reach.Mark, skipped on the common path: no error.
func marked(err error) error {
	if err == nil {
		return nil
	}
	return reach.Mark(err)
}

// runWithAck runs a script, then WAIT if replicas must ack: in the same
// round trip, or, for an acquire with a fragment (thenWait), only once
// granted. nowait skips it. short reports too few replicas acknowledging.
func (l *Locker) runWithAck(ctx context.Context, script *redis.Script, keys []string, args []any, thenWait, nowait bool, late func(any, error)) (reply any, short, err error) {
	if l.acks == 0 || nowait {
		reply, err = l.run(ctx, script, keys, args, late)
		return reply, nil, err
	}
	var lateAcked func(acked, error)
	if late != nil {
		lateAcked = func(a acked, err error) { late(a.reply, err) }
	}
	a, err := ctxcall.Do(ctx, l.runner.Workers(ctx), func(ctx context.Context) (acked, error) {
		if thenWait {
			return l.runThenWait(ctx, script, keys, args)
		}
		return l.pipeWait(ctx, script, keys, args)
	}, lateAcked)
	return a.reply, a.short, reach.Mark(err)
}

// scriptCall returns a lock script's keys and arguments, the fragment's first.
func scriptCall(call *Call, n *names, release bool, lockArgs ...any) ([]string, []any) {
	var ck []string
	var ca []any
	if call != nil {
		ck, ca = call.Keys, call.Args
	}
	var keys []string
	var args []any
	if len(ck)+4 <= smallKeys && len(ca)+len(lockArgs) <= smallArgs {
		small := new(smallCall) // one allocation for both
		keys, args = small.keys[:0], small.args[:0]
	} else {
		keys, args = make([]string, 0, len(ck)+4), make([]any, 0, len(ca)+len(lockArgs))
	}
	keys = append(append(keys, ck...), n.key)
	if release {
		keys = append(keys, n.nkey, n.tkey)
	}
	if n.fkey != "" {
		keys = append(keys, n.fkey)
	}
	return keys, append(append(args, ca...), lockArgs...)
}

type smallCall struct {
	keys [smallKeys]string
	args [smallArgs]any
}

const smallKeys, smallArgs = 8, 14

// Script arguments boxed once.
var (
	argZero  any = "0"
	argFresh any = ""
	argMark  any = "m"
)

// argID is a handle's id as a script argument.
func argID(id uint64) any {
	if id == 0 {
		return argZero
	}
	return strconv.FormatUint(id, 10)
}
