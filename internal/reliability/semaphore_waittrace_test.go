package reliability

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// semWaitLeaseBase is the lease of every acquisition in the waiting path's
// check; an Acquire asks for semWaitLeaseBase plus its id in milliseconds,
// so that semTrace can tell its scripts from the lease argument (its
// token is random, and a cancelled Acquire returns none).
const semWaitLeaseBase = time.Minute

// semTraced is what semTrace saw of one Acquire's scripts, in nanoseconds
// since the run's start: when the first was sent, when the first
// successful reply came, when the first cancel was sent, and when the
// last reply (or error) came; and the
// place in the queue that first reply gave (0 if it gave none: the
// permits were granted at once).
type semTraced struct {
	sent, firstOK, last int64
	seq                 int64
	cancel              int64 // when the first cancel was sent (0: none was)
}

// semTrace is a go-redis hook that times the scripts of each Acquire of
// the check (the first poll, which queues it, and the cancel that may run
// after Acquire returned), and counts the cancels that gave back permits
// granted meanwhile (a grant that raced the cancel).
type semTrace struct {
	start time.Time

	mu       sync.Mutex
	tokOp    map[string]int
	ops      map[int]*semTraced
	inflight int
	gaveBack int
}

var _ redis.Hook = (*semTrace)(nil)

func newSemTrace() *semTrace {
	return &semTrace{tokOp: map[string]int{}, ops: map[int]*semTraced{}}
}

// begin sets the time the trace counts from, before the run.
func (h *semTrace) begin(start time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.start = start
}

func (h *semTrace) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *semTrace) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.sent([]redis.Cmder{cmd})
		err := next(ctx, cmd)
		h.replied([]redis.Cmder{cmd}, err)
		return err
	}
}

func (h *semTrace) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.sent(cmds)
		err := next(ctx, cmds)
		h.replied(cmds, err)
		return err
	}
}

// sent records the first send of each traced Acquire's scripts.
func (h *semTrace) sent(cmds []redis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := int64(time.Since(h.start))
	h.inflight++
	for _, cmd := range cmds {
		argv := testutil.ScriptArgs(cmd)
		if len(argv) == 0 {
			continue
		}
		tok, _ := argv[0].(string)
		if len(argv) == 7 { // semaphore_acquire.lua: ARGV[4] is the lease
			lease, _ := argv[3].(int64)
			if id := int(lease - semWaitLeaseBase.Milliseconds()); id > 0 {
				h.tokOp[tok] = id
			}
		}
		id, ok := h.tokOp[tok]
		if !ok {
			continue
		}
		op := h.ops[id]
		if op == nil {
			op = &semTraced{sent: now}
			h.ops[id] = op
		}
		if len(argv) == 4 && argv[3] == "c" && op.cancel == 0 { // semaphore_release.lua's cancel
			op.cancel = now
		}
	}
}

// replied records the replies of the traced Acquires' scripts.
func (h *semTrace) replied(cmds []redis.Cmder, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := int64(time.Since(h.start))
	h.inflight--
	for _, cmd := range cmds {
		argv := testutil.ScriptArgs(cmd)
		if len(argv) == 0 {
			continue
		}
		tok, _ := argv[0].(string)
		id, ok := h.tokOp[tok]
		if !ok {
			continue
		}
		op := h.ops[id]
		op.last = now
		failed := cmd.Err() != nil || len(cmds) == 1 && err != nil
		if !failed && op.firstOK == 0 {
			op.firstOK = now
			op.seq = semReplySeq(cmd, argv)
		}
		if c, ok := cmd.(*redis.Cmd); ok && !failed && len(argv) == 4 && argv[3] == "c" {
			if v, _ := c.Int64(); v == 1 { // semaphore_release.lua: released
				h.gaveBack++
			}
		}
	}
}

// semReplySeq returns the place in the queue a semaphore_acquire.lua reply
// gives ({0, now, seq}), 0 for other replies.
func semReplySeq(cmd redis.Cmder, argv []any) int64 {
	c, ok := cmd.(*redis.Cmd)
	if !ok || len(argv) != 7 {
		return 0
	}
	r, err := c.Slice()
	if err != nil || len(r) != 3 || r[0] != int64(0) {
		return 0
	}
	var seq int64
	switch v := r[2].(type) {
	case int64:
		seq = v
	case string:
		seq, _ = strconv.ParseInt(v, 10, 64)
	}
	return seq
}

// settle waits until no command is in flight (a cancel may outlive its
// Acquire), and returns what the trace saw.
func (h *semTrace) settle(t *testing.T) (map[int]semTraced, int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		h.mu.Lock()
		if h.inflight == 0 {
			out := map[int]semTraced{}
			for id, op := range h.ops {
				out[id] = *op
			}
			gave := h.gaveBack
			h.mu.Unlock()
			return out, gave
		}
		h.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("commands still in flight 30 s after the run")
		}
	}
}
