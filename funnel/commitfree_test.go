package funnel_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// commitCounter counts the runs of commit.lua (EVALSHA of its hash).
type commitCounter struct{ n atomic.Int64 }

func (c *commitCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commitCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && args[1] == funnel.CommitSHA {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *commitCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A fleet on one hot key (four Limiters, four processes, 16 goroutines
// each, calls of 1 to 3 units) admits exactly the capacity, and Redis holds
// it: the crowded key's batches commit without the lock (commit.lua ran),
// each decided again on the state another's commit wrote.
func TestCommitFreeExactUnderRaces(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		const capacity = 300
		rule := funnel.Rule{Name: "budget", Capacity: capacity, Leak: 1, Per: 24 * time.Hour}
		commits := &commitCounter{}
		lims := make([]*funnel.Limiter, 4)
		for i := range lims {
			c := b.Client(t)
			c.AddHook(commits)
			lims[i] = mustLimiter(t, c, funnel.WithPrefix(b.Prefix))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang, not a speed target
		defer cancel()
		admitted, _ := raceUnits(t, ctx, lims, "budget", rule, 8)
		peek, err := lims[0].Peek(ctx, "budget", rule)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d units admitted of 1024 calls, %d commits without the lock", admitted.Load(), commits.n.Load())
		if sum := admitted.Load(); sum > capacity || peek.Remaining != capacity-sum {
			t.Fatalf("%d units admitted, %d left in Redis; want at most %d, each stored once", sum, peek.Remaining, capacity)
		}
		if commits.n.Load() == 0 {
			t.Fatal("no commit without the lock: the test did not test it")
		}
	})
}

// A crowded key's commit, decided on a state that another Limiter changed
// before it landed (between the read and the commit), is refused by
// commit.lua and decided again on the state it returned: one unit each,
// both admitted, Redis holds two.
func TestCommitFreeDecidedAgain(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		rule := funnel.Rule{Name: "r", Capacity: 10, Leak: 1, Per: 24 * time.Hour}
		client := b.Client(t)
		commits := &commitCounter{}
		client.AddHook(commits)
		other := newLimiter(t, b)
		// Ahead of the first commit (commit.lua), the other Limiter admits.
		var once sync.Once
		client.AddHook(&scriptHook{sha: funnel.CommitSHA, before: func(redis.Cmder) {
			once.Do(func() {
				if res, err := other.Allow(ctx, "k", rule); err != nil || !res.Allowed {
					t.Errorf("the other Limiter's call = %+v, %v", res, err)
				}
			})
		}})
		lim := mustLimiter(t, client, funnel.WithPrefix(b.Prefix))
		if err := funnel.SetCrowded(lim, "k", rule); err != nil {
			t.Fatal(err)
		}
		res, err := lim.Allow(ctx, "k", rule)
		if err != nil || !res.Allowed || res.Remaining != 8 {
			t.Fatalf("Allow = %+v, %v; want admitted after the other's unit, 8 left", res, err)
		}
		if n := commits.n.Load(); n != 2 {
			t.Fatalf("%d runs of commit.lua; want 2: one refused, one written", n)
		}
		if p := peek(t, lim, "k", rule); p.Remaining != 8 {
			t.Fatalf("Peek = %+v; want 8 left", p)
		}
	})
}

// A crowded key's commit respects the lock: while another holds it, the
// batch takes the lock path and waits; it writes nothing before.
func TestCommitFreeRespectsTheLock(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		lim := crowdedLimiter(t, b.Client(t), b.Prefix, "held")
		lk := waitsWhileHeld(t, b, lim, "held", crowdRule)
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if p := peek(t, lim, "held", crowdRule); p.Remaining != 9 {
			t.Fatalf("Peek = %+v; want 9 left: nothing written while the lock was held", p)
		}
	})
}

// A crowded key's commit whose reply is lost: go-redis runs commit.lua
// again, which finds the values it wrote (their nonce) and answers written:
// the call is admitted and takes one unit, not two.
func TestCommitFreeLostReply(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		rule := crowdRule
		client, fault := b.LostReplyClient(t, nil)
		lim := crowdedLimiter(t, client, b.Prefix, "k")
		// commit.lua: EVALSHA, or EVAL after NOSCRIPT; 2 keys, the state's first.
		fault.Drop(func(args []string) bool {
			return len(args) > 3 && args[2] == "2" && args[3] == b.Prefix+"{k}:f"
		})
		res, err := lim.Allow(ctx, "k", rule)
		fault.ExpectDropped(t, 1)
		if err != nil || !res.Allowed || res.Remaining != 8 {
			t.Fatalf("Allow with commit.lua's reply lost = %+v, %v; want admitted, 8 left", res, err)
		}
		if p := peek(t, lim, "k", rule); p.Remaining != 8 {
			t.Fatalf("Peek = %+v; want 8 left: the retry took nothing", p)
		}
	})
}

// crowdRule is the rule of the crowded-key tests: 10 units a day.
var crowdRule = funnel.Rule{Name: "r", Capacity: 10, Leak: 1, Per: 24 * time.Hour}

// crowdedLimiter returns a Limiter on client whose key has one unit of
// crowdRule taken and is marked crowded: its next batches commit without
// the lock.
func crowdedLimiter(t *testing.T, client *redis.Client, prefix, key string) *funnel.Limiter {
	t.Helper()
	lim := mustLimiter(t, client, funnel.WithPrefix(prefix))
	if res, err := lim.Allow(context.Background(), key, crowdRule); err != nil || !res.Allowed {
		t.Fatalf("first call = %+v, %v", res, err)
	}
	if err := funnel.SetCrowded(lim, key, crowdRule); err != nil {
		t.Fatal(err)
	}
	return lim
}
