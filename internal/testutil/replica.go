package testutil

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
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
	m, err := spawn(dataNode(""))
	if err != nil {
		t.Fatalf("start master: %v", err)
	}
	t.Cleanup(m.Stop)
	r := &Replicated{Master: m}
	for range n {
		s, err := spawn(dataNode(m.Addr))
		if err != nil {
			t.Fatalf("start replica: %v", err)
		}
		t.Cleanup(s.Stop)
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
		t.Fatal(err)
	}
	return r
}
