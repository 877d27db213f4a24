package funnel

import (
	"context"
	_ "embed"
	"fmt"
	"sync"

	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// A crowded key (its admissions in this process had others waiting) is
// admitted without its lock: a batch reads the state, decides its calls,
// and commits with commit.lua if the state is unchanged and the lock free
// (DESIGN.md, "Cost"). The batches of one key in this process take turns,
// so that they never make each other's commits fail.

var (
	//go:embed commit.lua
	commitSrc    string
	commitScript = redis.NewScript(readStateFunc + commitSrc)
)

// maxLost is how many commits may find the state changed before the batch
// takes the lock, whose waiters are served in turn.
const maxLost = 16

// readFree reads the state for a crowded batch, as a gate's with no lock:
// commit.lua's last reply that found it changed, or read.lua's.
func (l *leader) readFree(ctx context.Context) (*mutex.Lock, any, error) {
	reply := l.next
	l.next = nil
	if reply == nil {
		var err error
		reply, err = l.lim.locker.Eval(ctx, readPeek, []string{l.c.key}, l.c.set.ids...)
		if err != nil {
			return nil, nil, corrupt(fmt.Errorf("funnel: read: %w", err))
		}
	}
	_, res, err := readReply(reply)
	return nil, res, err
}

// commitFree writes the batch's decisions, write.lua's args, with
// commit.lua; it returns ws when the batch is decided again: on the state
// it found changed, or through the lock.
func (l *leader) commitFree(ctx context.Context, ws sealed, args []any) sealed {
	nonce := newNonce()
	reply, err := l.lim.locker.Eval(ctx, commitScript, []string{l.c.key, l.c.lock}, l.casArgs(args, nonce)...)
	if err != nil {
		ws.failAdmitted(corrupt(fmt.Errorf("funnel: commit: %w", err)))
		return nil
	}
	switch x := reply.(type) {
	case int64:
		if x < 0 {
			return l.wroteLate(ws, -x)
		}
		l.wrote(ws, args, nonce)
		return nil
	case []any:
		l.lost++
		if p, _ := x[0].(int64); p < 0 || l.lost >= maxLost {
			l.optimistic, l.seen = false, nil // the lock, through admit.lua's gate
		} else {
			l.next = x
		}
		return ws
	}
	ws.failAdmitted(fmt.Errorf("%w: commit returned %T", ErrCorruptState, reply))
	return nil
}

// casArgs returns commit.lua's arguments: the fields, the values read,
// write.lua's TTL and deadline, the values to write, and the nonce.
func (l *leader) casArgs(args []any, nonce string) []any {
	k := len(l.c.set.rules)
	cas := make([]any, 0, 3*k+3)
	cas = append(cas, l.c.set.ids...)
	for _, v := range l.seen {
		cas = append(cas, v)
	}
	cas = append(cas, args[0], args[1])
	for i := range k {
		cas = append(cas, args[3+2*i])
	}
	return append(cas, nonce)
}

// turns orders the crowded batches of one key in this process. An entry
// lives while a batch of its key holds or waits for the turn.
type turns struct {
	mu sync.Mutex
	m  map[batchKey]*turn
}

// A turn is one key's: ch holds a token while a batch has the turn; n
// counts the batches that have it or wait for it.
type turn struct {
	ch chan struct{}
	n  int
}

// take waits for k's turn, or ctx's end (then the error), and returns the
// function that gives the turn back.
func (ts *turns) take(ctx context.Context, k batchKey) (func(), error) {
	ts.mu.Lock()
	t := ts.m[k]
	if t == nil {
		if ts.m == nil {
			ts.m = make(map[batchKey]*turn)
		}
		t = &turn{ch: make(chan struct{}, 1)}
		ts.m[k] = t
	}
	t.n++
	ts.mu.Unlock()
	select {
	case t.ch <- struct{}{}:
		return func() {
			<-t.ch
			ts.leave(k, t)
		}, nil
	case <-ctx.Done():
		ts.leave(k, t)
		return nil, ctx.Err()
	}
}

func (ts *turns) leave(k batchKey, t *turn) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t.n--; t.n == 0 {
		delete(ts.m, k)
	}
}
