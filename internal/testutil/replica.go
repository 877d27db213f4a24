package testutil

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Replicated is a master with replicas, for tests of writes that wait for
// replicas (WAIT): no sentinels, nothing fails over.
type Replicated struct {
	Master   *Server
	Replicas []*Server
}

// StartReplicated starts a master and n replicas of it for t alone, waits
// until every replica is in sync, and stops them all when t ends.
func StartReplicated(t testing.TB, n int) *Replicated {
	t.Helper()
	NeedServer(t)
	r, err := SpawnReplicated(n)
	if r != nil {
		t.Cleanup(r.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// SpawnReplicated is StartReplicated outside any test (the bench program
// uses it); the caller must Stop what it returns, also with an error.
func SpawnReplicated(n int) (*Replicated, error) {
	m, err := spawn(dataNode(""))
	if err != nil {
		return nil, fmt.Errorf("start master: %w", err)
	}
	r := &Replicated{Master: m}
	for range n {
		s, err := spawn(dataNode(m.Addr))
		if err != nil {
			return r, fmt.Errorf("start replica: %w", err)
		}
		r.Replicas = append(r.Replicas, s)
	}
	want := fmt.Sprintf("connected_slaves:%d", n)
	err = waitFor(20*time.Second, "replicas in sync", func(ctx context.Context) (bool, string) {
		info, err := nodeCmd(ctx, m.Addr, "INFO", "replication")
		if err != nil {
			return false, err.Error()
		}
		s := info.(string)
		return strings.Contains(s, want) && !strings.Contains(s, "state=wait_bgsave") && !strings.Contains(s, "state=send_bulk"), s
	})
	if err != nil {
		return r, err
	}
	// The first WAIT after a replica connects can take a second: have it
	// here, not in the test's first timed call.
	c := redis.NewClient(&redis.Options{Addr: m.Addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Set(ctx, "testutil:replicated", "1", time.Second).Err(); err != nil {
		return r, err
	}
	if got, err := c.Wait(ctx, n, 15*time.Second).Result(); err != nil || got < int64(n) {
		return r, fmt.Errorf("WAIT %d after the replicas synced: %d, %v", n, got, err)
	}
	return r, nil
}

// Stop stops the master and the replicas, by pid.
func (r *Replicated) Stop() {
	stopParallel(append([]*Server{r.Master}, r.Replicas...))
}
