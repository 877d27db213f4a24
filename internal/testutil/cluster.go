package testutil

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterSize is the number of masters of a test cluster: enough that keys
// spread over several nodes, few enough to start in a second or two.
const clusterSize = 3

// ClusterServers is a Redis Cluster of three masters without replicas, each
// a server on a loopback port with its own directory (see Server).
type ClusterServers struct {
	// Addrs are the masters' addresses (127.0.0.1:port), in the order of
	// Nodes; any of them seeds a ClusterClient.
	Addrs []string
	// Nodes are the masters' processes.
	Nodes []*Server
	// Took is how long the cluster took to start and agree on its slots.
	Took time.Duration
}

// sharedCluster is the one cluster of a test binary, started on first use
// and stopped by Main.
var sharedCluster struct {
	once sync.Once
	c    *ClusterServers
	err  error
}

// NeedCluster skips t when the server binary (ServerEnv) or the CLI (CLIEnv,
// which creates the cluster) is not installed, or fails it when
// FUNNELGUARD_REQUIRE_REDIS=1.
func NeedCluster(t testing.TB) {
	t.Helper()
	NeedServer(t)
	if cliPath() == "" {
		missing(t, cliBin.missing())
	}
}

// Cluster returns the test binary's shared cluster, starting it on first use;
// Main stops it. Tests on it must keep their keys under a prefix of their own
// (Prefix): never FLUSHALL it.
func Cluster(t testing.TB) *ClusterServers {
	t.Helper()
	NeedCluster(t)
	sharedCluster.once.Do(func() {
		sharedCluster.c, sharedCluster.err = startCluster()
		if sharedCluster.err == nil {
			stopAtExit(sharedCluster.c.Stop)
		}
	})
	if sharedCluster.err != nil {
		t.Fatalf("shared redis cluster: %v", sharedCluster.err)
	}
	return sharedCluster.c
}

// StartCluster starts a cluster for t alone and stops it when t ends: for
// tests that kill or pause nodes. Other tests share one through Cluster.
func StartCluster(t testing.TB) *ClusterServers {
	t.Helper()
	NeedCluster(t)
	c, err := startCluster()
	if err != nil {
		t.Fatalf("start redis cluster: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// startCluster spawns three nodes, joins them with `<cli> --cluster create`
// (CLIEnv) and waits until every node reports cluster_state:ok and knows the
// others.
func startCluster() (*ClusterServers, error) {
	if serverPath() == "" {
		return nil, serverBin.err()
	}
	if cliPath() == "" {
		return nil, cliBin.err()
	}
	start := time.Now()
	nodes, err := spawnAll(clusterSize, spawnSpec{prepare: clusterNode})
	c := &ClusterServers{Nodes: nodes}
	if err != nil {
		c.Stop()
		return nil, err
	}
	for _, n := range nodes {
		c.Addrs = append(c.Addrs, n.Addr)
	}
	if err := c.create(); err != nil {
		c.Stop()
		return nil, err
	}
	c.Took = time.Since(start)
	return c, nil
}

// clusterNode is the spawnSpec.prepare of a cluster node. The cluster bus
// gets a free port of its own: the default, port+10000, may not exist.
func clusterNode(dir, _ string) (string, []string, error) {
	bus, err := freePort()
	if err != nil {
		return "", nil, err
	}
	return "", []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
		"--cluster-node-timeout", "2000",
		"--cluster-port", strconv.Itoa(bus),
	}, nil
}

// spawnAll spawns n servers of spec in parallel; on error it stops those
// that started and returns the first error.
func spawnAll(n int, spec spawnSpec) ([]*Server, error) {
	servers := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { servers[i], errs[i] = spawn(spec) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, s := range servers {
			if s != nil {
				s.Stop()
			}
		}
		return nil, err
	}
	return servers, nil
}

// create joins the nodes into one cluster and waits until it is usable.
func (c *ClusterServers) create() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, cliPath(), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s --cluster create: %w: %s", cliBin.name(), err, tail(out, 600))
	}
	return waitFor(15*time.Second, "cluster_state:ok on every node", func(ctx context.Context) (bool, string) {
		for _, addr := range c.Addrs {
			info, err := nodeCmd(ctx, addr, "CLUSTER", "INFO")
			if err != nil {
				return false, fmt.Sprintf("%s: %v", addr, err)
			}
			s := info.(string)
			if !strings.Contains(s, "cluster_state:ok") ||
				!strings.Contains(s, "cluster_known_nodes:"+strconv.Itoa(clusterSize)) ||
				!strings.Contains(s, "cluster_slots_ok:16384") {
				return false, fmt.Sprintf("%s: %s", addr, strings.ReplaceAll(strings.TrimSpace(s), "\r\n", " "))
			}
		}
		return true, ""
	})
}

// nodeCmd runs one command on the server at addr with a client of its own.
func nodeCmd(ctx context.Context, addr string, args ...any) (any, error) {
	cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer cl.Close()
	return cl.Do(ctx, args...).Result()
}

// setupWait bounds a wait for servers to agree (sentinels on their group, a
// failover): it only stops a hang, so it is wide enough for a machine whose
// two cores run several test binaries at once (a load of 6 once took
// sentinels past 20 s to learn of each other: their hello messages go out
// every 2 s).
const setupWait = 60 * time.Second

// waitFor polls cond every 50 ms until it holds or d passes; the error then
// says what was awaited and cond's last word on why it did not hold.
func waitFor(d time.Duration, what string, cond func(ctx context.Context) (bool, string)) error {
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ok, why := cond(ctx)
		cancel()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s after %v: %s", what, d, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Client returns a cluster client that t closes when it ends.
func (c *ClusterServers) Client(t testing.TB) *redis.ClusterClient {
	return c.ClientOpts(t, &redis.ClusterOptions{})
}

// ClientOpts is Client with options; Addrs is set by the cluster.
func (c *ClusterServers) ClientOpts(t testing.TB, o *redis.ClusterOptions) *redis.ClusterClient {
	o.Addrs = append([]string(nil), c.Addrs...)
	cl := redis.NewClusterClient(o)
	t.Cleanup(func() { cl.Close() })
	return cl
}

// Prefix returns a fresh key prefix (NewPrefix) whose keys are deleted from
// every node when t ends.
func (c *ClusterServers) Prefix(t testing.TB) string {
	p := NewPrefix()
	t.Cleanup(func() {
		for _, addr := range c.Addrs {
			deleteKeysOneByOne(addr, p)
		}
	})
	return p
}

// deleteKeysOneByOne removes the keys under prefix from the server at addr
// with one UNLINK per key, so that keys of different cluster slots never
// meet in one command.
func deleteKeysOneByOne(addr, prefix string) {
	cl := redis.NewClient(&redis.Options{Addr: addr})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := cl.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	pipe := cl.Pipeline()
	for iter.Next(ctx) {
		pipe.Unlink(ctx, iter.Val())
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx)
	}
}

// Stop ends every node (see Server.Stop).
func (c *ClusterServers) Stop() { stopParallel(c.Nodes) }

// stopParallel stops servers at once rather than one after another.
func stopParallel(servers []*Server) {
	var wg sync.WaitGroup
	for _, s := range servers {
		if s != nil {
			wg.Go(s.Stop)
		}
	}
	wg.Wait()
}

// A Deployment is a Redis of several servers that a test runs on: the shared
// cluster or the shared sentinel group, with a key prefix of the test's own.
type Deployment struct {
	// Name is "cluster" or "sentinel".
	Name string
	// Cluster is the shared cluster; nil on the sentinel group.
	Cluster *ClusterServers
	// Sentinel is the shared sentinel group; nil on the cluster.
	Sentinel *SentinelGroup
	// Prefix is unique to the test: every key the test writes should start
	// with it. Keys under it are deleted when the test ends.
	Prefix string
}

// Client returns a client of the deployment that t closes when it ends: a
// *redis.ClusterClient on the cluster, a failover *redis.Client on the
// sentinel group.
func (d *Deployment) Client(t testing.TB) redis.UniversalClient {
	if d.Cluster != nil {
		return d.Cluster.Client(t)
	}
	return d.Sentinel.Client(t)
}

// ScaleOut runs f as two subtests of t, "cluster" and "sentinel": on the
// shared cluster (Cluster) and through a failover client on the shared
// sentinel group (Sentinel). The cluster subtest skips without the server
// binary or the CLI (NeedCluster), the sentinel one without the server
// binary (NeedServer); FUNNELGUARD_REQUIRE_REDIS=1 turns the skips into
// failures.
func ScaleOut(t *testing.T, f func(t *testing.T, d *Deployment)) {
	t.Helper()
	if serverPath() != "" {
		// Start the sentinel group while the cluster starts; Sentinel waits
		// for it.
		go sharedSentinelStart()
	}
	t.Run("cluster", func(t *testing.T) {
		c := Cluster(t)
		f(t, &Deployment{Name: "cluster", Cluster: c, Prefix: c.Prefix(t)})
	})
	t.Run("sentinel", func(t *testing.T) {
		g := Sentinel(t)
		f(t, &Deployment{Name: "sentinel", Sentinel: g, Prefix: g.Prefix(t)})
	})
}
