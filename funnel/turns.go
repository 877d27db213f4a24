package funnel

import (
	"context"
	"sync"
)

// turns serializes the batches of one key in this process on the path
// without the lock (commitfree.go): a leader reads and commits in its turn,
// so that the batches of one process never make each other's commits find
// the state changed, and the calls that come meanwhile gather in the next
// batch, which is still open while its leader waits. An entry lives while
// a batch of its key holds or waits for the turn.
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
		return func() { ts.leave(k, t, true) }, nil
	case <-ctx.Done():
		ts.leave(k, t, false)
		return nil, ctx.Err()
	}
}

// leave gives k's turn back if held, and forgets k when no batch wants it.
func (ts *turns) leave(k batchKey, t *turn, held bool) {
	if held {
		<-t.ch
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t.n--; t.n == 0 {
		delete(ts.m, k)
	}
}
