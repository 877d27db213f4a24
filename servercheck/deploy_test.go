package servercheck_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/servercheck"
	"github.com/redis/go-redis/v9"
)

// On a cluster every master is asked: one with an evicting policy gives
// exactly one failing finding, naming it. One that hangs gives exactly one
// finding of no answer, by the deadline, naming it.
func TestCluster(t *testing.T) {
	cl := testutil.StartCluster(t)
	bad := cl.Addrs[1]
	c := cl.ClientOpts(t, &redis.ClusterOptions{ContextTimeoutEnabled: true})

	t.Run("one evicting master", func(t *testing.T) {
		admin := cl.Nodes[1].Client(t)
		configSet(t, admin, "maxmemory-policy", "volatile-lru")
		configSet(t, admin, "maxmemory", "100mb")
		t.Cleanup(func() { configSet(t, admin, "maxmemory-policy", "noeviction") })
		findings, err := check(t, c, 5*time.Second)
		if len(findings) != len(cl.Addrs) {
			t.Fatalf("findings = %+v; want one per master (%v)", findings, cl.Addrs)
		}
		var failing []servercheck.Finding
		for _, f := range findings {
			if f.Err != nil {
				failing = append(failing, f)
			}
		}
		if len(failing) != 1 || failing[0].Addr != bad || !errors.Is(failing[0].Err, servercheck.ErrEvictionPolicy) {
			t.Fatalf("failing findings = %+v; want one of ErrEvictionPolicy for %s", failing, bad)
		}
		if !errors.Is(err, servercheck.ErrEvictionPolicy) || !strings.Contains(err.Error(), bad) {
			t.Fatalf("err = %v; want ErrEvictionPolicy naming %s", err, bad)
		}
	})

	t.Run("one hung master", func(t *testing.T) {
		if _, err := check(t, c, 5*time.Second); err != nil { // the client knows the slots
			t.Fatal(err)
		}
		testutil.Freeze(t, cl.Nodes[1].Pid())
		// The client reloads the slots from a node picked at random: a few
		// rounds pick the hung one too.
		const deadline = 600 * time.Millisecond
		for round := range 4 {
			start := time.Now()
			findings, err := check(t, c, deadline)
			took := time.Since(start)
			t.Logf("round %d: Check on a cluster with one master SIGSTOPped, %v deadline: returned after %v: %v", round, deadline, took, err)
			if took > deadline+hungBound {
				t.Errorf("Check took %v; want its deadline, %v", took, deadline)
			}
			if len(findings) != len(cl.Addrs) {
				t.Fatalf("findings = %+v; want one per master", findings)
			}
			for _, f := range findings {
				hung := f.Addr == bad
				if hung != errors.Is(f.Err, servercheck.ErrNoAnswer) || hung != errors.Is(f.Err, context.DeadlineExceeded) || !hung && f.Err != nil {
					t.Errorf("finding %+v; want ErrNoAnswer and DeadlineExceeded for %s only", f, bad)
				}
			}
		}
	})
}

// A ring's every shard is asked, and a shard that is down gets a finding of
// no answer.
func TestRing(t *testing.T) {
	srvs := testutil.StartServers(t, 2)
	configSet(t, srvs[1].Client(t), "maxmemory-policy", "allkeys-lfu")
	configSet(t, srvs[1].Client(t), "maxmemory", "100mb")
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srvs[0].Addr, "b": srvs[1].Addr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { ring.Close() })

	findings, err := check(t, ring, 5*time.Second)
	if len(findings) != 2 || findings[0].Addr > findings[1].Addr {
		t.Fatalf("findings = %+v; want two, by address", findings)
	}
	for _, f := range findings {
		if bad := f.Addr == srvs[1].Addr; bad != errors.Is(f.Err, servercheck.ErrEvictionPolicy) || !bad && f.Err != nil {
			t.Errorf("finding %+v; want ErrEvictionPolicy for %s only", f, srvs[1].Addr)
		}
	}
	if !errors.Is(err, servercheck.ErrEvictionPolicy) {
		t.Errorf("err = %v; want ErrEvictionPolicy", err)
	}

	srvs[0].Kill()
	findings, err = check(t, ring, 5*time.Second)
	if len(findings) != 2 || !errors.Is(err, servercheck.ErrNoAnswer) || !errors.Is(err, servercheck.ErrEvictionPolicy) {
		t.Fatalf("after a shard's kill: %+v, %v; want two findings, of ErrNoAnswer and ErrEvictionPolicy", findings, err)
	}
	for _, f := range findings {
		if down := f.Addr == srvs[0].Addr; down != errors.Is(f.Err, servercheck.ErrNoAnswer) {
			t.Errorf("finding %+v; want ErrNoAnswer for the killed %s only", f, srvs[0].Addr)
		}
	}
}

// A failover client's finding names the master it writes to.
func TestFailover(t *testing.T) {
	g := testutil.Sentinel(t)
	c := g.ClientOpts(t, &redis.FailoverOptions{ContextTimeoutEnabled: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	master, err := g.MasterAddr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	findings, err := servercheck.Check(ctx, c)
	if err != nil || len(findings) != 1 || findings[0].Addr != master || findings[0].Policy != "noeviction" {
		t.Fatalf("Check = %+v, %v; want the master %s, safe", findings, err, master)
	}
}
