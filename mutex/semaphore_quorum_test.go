package mutex_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// TestSemaphoreQuorumTable checks SemaphoreQuorum against the table of the
// Semaphore doc and RELIABILITY.md, and against brute force: with its Q no
// placement of size+1 holders on Q nodes each fits under size per node;
// with Q-1 one does (a majority is not enough from size 2 on).
func TestSemaphoreQuorumTable(t *testing.T) {
	table := map[int][]int{ // nodes: Q for sizes 1..6
		3: {2, 3, 3, 3, 3, 3},
		5: {3, 4, 4, 5, 5, 5},
		7: {4, 5, 6, 6, 6, 7},
	}
	for m, qs := range table {
		for i, want := range qs {
			if got, err := mutex.SemaphoreQuorum(m, int64(i+1)); err != nil || got != want {
				t.Errorf("SemaphoreQuorum(%d, %d) = %d, %v; want %d", m, i+1, got, err, want)
			}
		}
	}
	for m := 1; m <= 6; m++ {
		for n := 1; n <= 4; n++ {
			q, err := mutex.SemaphoreQuorum(m, int64(n))
			if err != nil {
				t.Fatal(err)
			}
			if overfills(m, n, q) {
				t.Errorf("M=%d N=%d: %d holders fit on Q=%d nodes each", m, n, n+1, q)
			}
			if q > 1 && !overfills(m, n, q-1) {
				t.Errorf("M=%d N=%d: Q=%d is not the least: Q-1 keeps the count too", m, n, q)
			}
		}
	}
	if got, err := mutex.SemaphoreQuorum(5, math.MaxInt64); err != nil || got != 5 {
		t.Errorf("SemaphoreQuorum(5, MaxInt64) = %d, %v; want 5", got, err)
	}
	for _, bad := range [][2]int64{{0, 1}, {3, 0}, {-1, 2}, {3, -5}} {
		if _, err := mutex.SemaphoreQuorum(int(bad[0]), bad[1]); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("SemaphoreQuorum(%d, %d): %v, want ErrInvalid", bad[0], bad[1], err)
		}
	}
}

// overfills reports whether n+1 holders of one permit each can hold on q of
// m nodes with at most n permits per node: a search over the holders'
// node sets (in non-decreasing order, as the holders are alike).
func overfills(m, n, q int) bool {
	var sets []uint
	for s := uint(0); s < 1<<m; s++ {
		if popcount(s) == q {
			sets = append(sets, s)
		}
	}
	load := make([]int, m)
	var place func(holder, from int) bool
	place = func(holder, from int) bool {
		if holder == n+1 {
			return true
		}
		for i := from; i < len(sets); i++ {
			if add(load, sets[i], 1, n) {
				ok := place(holder+1, i)
				add(load, sets[i], -1, n)
				if ok {
					return true
				}
			}
		}
		return false
	}
	return place(0, 0)
}

// add adds d to the load of the nodes in set; it undoes itself and reports
// false when a node would exceed limit.
func add(load []int, set uint, d, limit int) bool {
	for i := range load {
		if set&(1<<i) == 0 {
			continue
		}
		if load[i]+d > limit {
			for j := range i {
				if set&(1<<j) != 0 {
					load[j] -= d
				}
			}
			return false
		}
		load[i] += d
	}
	return true
}

func popcount(s uint) int {
	c := 0
	for ; s != 0; s &= s - 1 {
		c++
	}
	return c
}

// semNodes returns a plain Locker of prefix on each server: a view of
// each node alone, to place permits node by node.
func semNodes(t *testing.T, srvs []*testutil.Server, prefix string) []*mutex.Locker {
	out := make([]*mutex.Locker, len(srvs))
	for i, s := range srvs {
		out[i] = mustNew(t, s.Client(t), mutex.WithPrefix(prefix))
	}
	return out
}

// A majority is not a quorum for size 2 on 3 nodes. Holder A takes a permit
// on nodes 0 and 1 and holder B on nodes 1 and 2: each node holds at most
// 2, and each holder holds a majority. A third, on nodes 2 and 0, fits on
// both: three holders of a semaphore of 2, each on a majority. The quorum
// Locker (Q = 3) refuses that third acquisition and leaves nothing behind.
func TestSemaphoreQuorumMajorityOverfills(t *testing.T) {
	srvs, clients := quorumNodes(t, 3)
	ctx := context.Background()
	prefix := testutil.NewPrefix()
	nodes := semNodes(t, srvs, prefix)
	for _, set := range [][]int{{0, 1}, {1, 2}} {
		for _, i := range set {
			if _, err := mustSem(t, nodes[i], "sms", 2).TryAcquire(ctx, 1, mutex.WithTTL(time.Minute)); err != nil {
				t.Fatalf("node %d: %v", i, err)
			}
		}
	}
	q, err := mutex.NewQuorum(clients, mutex.WithPrefix(prefix), mutex.WithNodeTimeout(quorumNodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	s := mustSem(t, q, "sms", 2)
	if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, mutex.ErrNoPermits) {
		t.Fatalf("third holder on a quorum of 3 for size 2: %v, want ErrNoPermits (a majority would grant it)", err)
	}
	key := mutex.SemKey(s, "sem")
	for i, srv := range srvs {
		want := []int64{1, 2, 1}[i]
		if got, _, _ := parseSemCounts(srv.Client(t).HGet(ctx, key, "m").Val()); got != want {
			t.Errorf("node %d holds %d permits after the refusal, want %d", i, got, want)
		}
	}
	// Only a majority free: 1 on nodes 0 and 2, none on node 1.
	if _, err := s.Acquire(ctxTimeout(t, 300*time.Millisecond), 1); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("Acquire with a majority free: %v, want ErrNotObtained", err)
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Too few nodes: with 3 nodes and size 2 every node must grant (Q = 3), so
// one node down refuses every acquisition with ErrNoQuorum (Acquire too, at
// once), and the live nodes keep nothing; with 5 nodes (Q = 4) one node down
// is survived (acquire, extend, release), two are not.
func TestSemaphoreQuorumRefusal(t *testing.T) {
	srvs := testutil.StartServers(t, 5)
	var clients []mutex.Client
	for _, s := range srvs {
		clients = append(clients, mustClient(t, s))
	}
	ctx := ctxTimeout(t, time.Minute)
	three := newQuorum(t, clients[:3], mutex.WithRetryInterval(10*time.Millisecond))
	s3 := mustSem(t, three, "x", 2)
	p, err := s3.TryAcquire(ctx, 2)
	if err != nil {
		t.Fatalf("TryAcquire(2) on 3 nodes: %v", err)
	}
	if p.Fence() != 0 {
		t.Errorf("Fence on a quorum: %d, want 0", p.Fence())
	}
	if err := p.Release(ctx); err != nil {
		t.Fatalf("Release on 3 nodes: %v", err)
	}
	srvs[2].Kill()
	if _, err := s3.TryAcquire(ctx, 1); !errors.Is(err, mutex.ErrNoQuorum) {
		t.Fatalf("TryAcquire with 2 of 3 nodes, Q = 3: %v, want ErrNoQuorum", err)
	}
	if _, err := s3.Acquire(ctx, 1); !errors.Is(err, mutex.ErrNoQuorum) || ctx.Err() != nil {
		t.Fatalf("Acquire with 2 of 3 nodes, Q = 3: %v, want ErrNoQuorum at once", err)
	}
	for i := range 2 {
		if n := srvs[i].Client(t).ZCount(ctx, mutex.SemKey(s3, "sem:ends"), "-inf", semRecordScore).Val(); n != 0 {
			t.Errorf("node %d keeps holders after the refusal", i)
		}
	}

	five := newQuorum(t, []mutex.Client{clients[0], clients[1], clients[3], clients[4], mustClient(t, srvs[2])})
	s5 := mustSem(t, five, "y", 2) // node 2 (last) is down: 4 of 5
	p, err = s5.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatalf("TryAcquire with 4 of 5 nodes, Q = 4: %v", err)
	}
	if err := p.Extend(ctx, time.Minute); err != nil {
		t.Fatalf("Extend with 4 of 5 nodes: %v", err)
	}
	srvs[4].Kill()
	if _, err := s5.TryAcquire(ctx, 1); !errors.Is(err, mutex.ErrNoQuorum) {
		t.Fatalf("TryAcquire with 3 of 5 nodes, Q = 4: %v, want ErrNoQuorum", err)
	}
	if err := p.Extend(ctx, time.Minute); !errors.Is(err, mutex.ErrNoQuorum) {
		t.Fatalf("Extend with 3 of 5 nodes: %v, want ErrNoQuorum", err)
	}
	if err := p.Release(ctx); !errors.Is(err, mutex.ErrNoQuorum) {
		t.Fatalf("Release with 3 of 5 nodes: %v, want ErrNoQuorum", err)
	}
	if err := srvs[4].Restart(); err != nil {
		t.Fatal(err)
	}
	// The restarted node forgot the permit: 3 of 5 still have it, fewer than
	// Q, so the Permit is not held any more.
	if err := p.Release(ctx); !errors.Is(err, mutex.ErrNoQuorum) && !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("Release with a node that forgot: %v, want ErrNoQuorum or ErrNotHeld", err)
	}
}

// mustClient returns a quorum node's client of s (honouring deadlines).
// Its pool is larger than the dials that fail on a dead node in a test: at
// PoolSize failed dials go-redis starts re-dialling in the background, every
// second, which would outlive the test. A dead node refuses at once: no
// retries (the test is not about lost replies).
func mustClient(t *testing.T, s *testutil.Server) mutex.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true, PoolSize: 200, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

// An acquisition counts only within its validity: with a node frozen, the
// call waits for the node timeout (300 ms), longer than a 200 ms lease, so
// the grants of the two live nodes are given back and the call fails with
// ErrNoQuorum; with a lease of 10 s the same call holds (Q = 2 for size 1).
func TestSemaphoreQuorumValidity(t *testing.T) {
	srvs, clients := quorumNodes(t, 3)
	ctx := ctxTimeout(t, time.Minute)
	l := newQuorum(t, clients, mutex.WithNodeTimeout(300*time.Millisecond))
	s := mustSem(t, l, "v", 1)
	thaw := testutil.Freeze(t, srvs[2].Pid())
	defer thaw()
	if _, err := s.TryAcquire(ctx, 1, mutex.WithTTL(200*time.Millisecond)); !errors.Is(err, mutex.ErrNoQuorum) {
		t.Fatalf("TryAcquire that outlasted its lease: %v, want ErrNoQuorum", err)
	}
	for i := range 2 {
		if n := srvs[i].Client(t).ZCount(ctx, mutex.SemKey(s, "sem:ends"), "-inf", semRecordScore).Val(); n != 0 {
			t.Errorf("node %d keeps %d holders of the late acquisition", i, n)
		}
	}
	p, err := s.TryAcquire(ctx, 1, mutex.WithTTL(10*time.Second))
	if err != nil {
		t.Fatalf("TryAcquire with 2 of 3 nodes, Q = 2: %v", err)
	}
	if !mutex.PermitDeadline(p).After(time.Now()) {
		t.Error("the Permit's deadline has passed already")
	}
	thaw()
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
