package testutil

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A ReplicatedCluster is a Redis Cluster of three masters with one replica
// each, for tests of writes that wait for replicas (WAIT) in a cluster.
type ReplicatedCluster struct {
	Nodes []*Server
	Addrs []string
}

// StartReplicatedCluster starts a cluster of three masters and three
// replicas for t alone, waits until every replica is in sync, and stops the
// nodes when t ends. It skips like NeedCluster.
func StartReplicatedCluster(t testing.TB) *ReplicatedCluster {
	t.Helper()
	NeedCluster(t)
	nodes, err := spawnAll(2*clusterSize, spawnSpec{prepare: clusterNode})
	if err != nil {
		t.Fatalf("start cluster nodes: %v", err)
	}
	c := &ReplicatedCluster{Nodes: nodes}
	t.Cleanup(func() { stopParallel(nodes) })
	for _, n := range nodes {
		c.Addrs = append(c.Addrs, n.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cliPath(), args...).CombinedOutput(); err != nil {
		t.Fatalf("--cluster create with replicas: %v: %s", err, tail(out, 600))
	}
	err = waitFor(60*time.Second, "a cluster of 3 masters, each with a replica in sync", func(ctx context.Context) (bool, string) {
		return replicatedReady(ctx, c.Addrs)
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// replicatedReady reports whether every node of addrs has the cluster in
// state ok, knows every other node, and, as a master, has its replica
// connected or, as a replica, its master's link up; else what is not yet.
func replicatedReady(ctx context.Context, addrs []string) (bool, string) {
	for _, addr := range addrs {
		info, err := nodeCmd(ctx, addr, "CLUSTER", "INFO")
		if err != nil {
			return false, fmt.Sprintf("%s: %v", addr, err)
		}
		if s := info.(string); !strings.Contains(s, "cluster_state:ok") {
			return false, addr + ": " + s
		}
		if ok, why := knowsAll(ctx, addr, addrs); !ok {
			return false, why
		}
		repl, err := nodeCmd(ctx, addr, "INFO", "replication")
		if err != nil {
			return false, fmt.Sprintf("%s: %v", addr, err)
		}
		s := repl.(string)
		if strings.Contains(s, "role:master") && !strings.Contains(s, "connected_slaves:1") ||
			strings.Contains(s, "role:slave") && !strings.Contains(s, "master_link_status:up") {
			return false, addr + ": " + s
		}
	}
	return true, ""
}

// Client returns a cluster client that t closes when it ends.
func (c *ReplicatedCluster) Client(t testing.TB) *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { cl.Close() })
	return cl
}

// ReplicaOf returns the replica of the master that serves key.
func (c *ReplicatedCluster) ReplicaOf(t testing.TB, key string) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl := c.Client(t)
	m, err := cl.MasterForKey(ctx, key)
	if err != nil {
		t.Fatalf("master of %q: %v", key, err)
	}
	_, port, _ := net.SplitHostPort(m.Options().Addr)
	for _, n := range c.Nodes {
		repl, err := nodeCmd(ctx, n.Addr, "INFO", "replication")
		if err == nil && strings.Contains(repl.(string), "role:slave") && strings.Contains(repl.(string), "master_port:"+port+"\r\n") {
			return n
		}
	}
	var seen []string
	for _, n := range c.Nodes {
		repl, err := nodeCmd(ctx, n.Addr, "INFO", "replication")
		seen = append(seen, fmt.Sprintf("%s: %v %v", n.Addr, repl, err))
	}
	t.Fatalf("no replica of %s, the master of %q: %s", m.Options().Addr, key, strings.Join(seen, "; "))
	return nil
}

// knowsAll reports whether the node at addr knows every node of addrs as a
// peer whose handshake is done. A loaded machine can lose a handshake (one
// node knew 5 of 6 after 30 s): knowsAll then has the node meet the nodes it
// has no entry for, and only those. A MEET of a node already known, or in
// handshake, adds an entry of its own until its handshake ends, so meeting
// them all at every poll kept the count above 6 (11 known nodes after 60 s).
func knowsAll(ctx context.Context, addr string, addrs []string) (bool, string) {
	out, err := nodeCmd(ctx, addr, "CLUSTER", "NODES")
	if err != nil {
		return false, fmt.Sprintf("%s: %v", addr, err)
	}
	table, _ := out.(string)
	done := 0
	for _, other := range addrs {
		flags, found := peerFlags(table, other)
		switch {
		case !found:
			if host, port, err := net.SplitHostPort(other); err == nil {
				_, _ = nodeCmd(ctx, addr, "CLUSTER", "MEET", host, port)
			}
		case !strings.Contains(flags, "handshake"):
			done++
		}
	}
	if done != len(addrs) {
		return false, fmt.Sprintf("%s knows %d of %d nodes: %s", addr, done, len(addrs), table)
	}
	return true, ""
}

// peerFlags returns the flags of the entry for addr (host:port) in a CLUSTER
// NODES table: "<id> <host:port@bus[,hostname]> <flags> ...".
func peerFlags(table, addr string) (string, bool) {
	for line := range strings.Lines(table) {
		f := strings.Fields(line)
		if len(f) > 2 && strings.HasPrefix(f[1], addr+"@") {
			return f[2], true
		}
	}
	return "", false
}
