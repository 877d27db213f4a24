package testutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// MasterName is the name under which a SentinelGroup's sentinels monitor its
// master.
const MasterName = "fgmaster"

// Timing of a SentinelGroup: a master that does not answer for downAfter is
// down for the sentinel that sees it, and down for all once two agree
// (the quorum); the group then promotes the replica. A failover takes a few
// seconds.
const (
	downAfter       = time.Second
	failoverTimeout = 5 * time.Second
	// detachedDownAfter is downAfter once the replicas are detached
	// (DetachReplicas): sentinels promote only a replica whose link has
	// been down for less than 10 down-afters (plus the time the master has
	// been down), so with one second a test that takes 10 s between the
	// cut and the kill on a loaded machine would get no failover at all.
	detachedDownAfter = 6 * time.Second
	sentinelQuorum    = 2
	sentinelCount     = 3
)

// A SentinelGroup is a Redis master, one replica of it and three sentinels
// that monitor them and fail over to the replica when the master dies, each a
// server on a loopback port with its own directory (see Server); the
// sentinels are the server binary run with --sentinel.
type SentinelGroup struct {
	// MasterName is the name the sentinels know the master by (MasterName).
	MasterName string
	// SentinelAddrs are the sentinels' addresses, for FailoverOptions.
	SentinelAddrs []string
	// Sentinels are the sentinels' processes.
	Sentinels []*Server
	// Data are the master and the replica as started, in that order; after
	// a failover Master tells which one is master.
	Data []*Server
	// Took is how long the group took to start and agree on its members.
	Took time.Duration
}

// sharedSentinel is the one sentinel group of a test binary, started on first
// use and stopped by Main.
var sharedSentinel struct {
	once sync.Once
	g    *SentinelGroup
	err  error
}

// Sentinel returns the test binary's shared sentinel group, starting it on
// first use; Main stops it. Tests on it must keep their keys under a prefix of
// their own (Prefix) and must not kill its servers: a test that does starts a
// group of its own with StartSentinel.
func Sentinel(t testing.TB) *SentinelGroup {
	t.Helper()
	NeedServer(t)
	sharedSentinelStart()
	if sharedSentinel.err != nil {
		t.Fatalf("shared sentinel group: %v", sharedSentinel.err)
	}
	return sharedSentinel.g
}

// sharedSentinelStart starts the shared group once; every call returns when
// it has started or failed.
func sharedSentinelStart() {
	sharedSentinel.once.Do(func() {
		sharedSentinel.g, sharedSentinel.err = startSentinel()
		if sharedSentinel.err == nil {
			stopAtExit(sharedSentinel.g.Stop)
		}
	})
}

// StartSentinel starts a sentinel group for t alone and stops it when t ends:
// for tests that kill its master.
func StartSentinel(t testing.TB) *SentinelGroup {
	t.Helper()
	NeedServer(t)
	g, err := startSentinel()
	if err != nil {
		t.Fatalf("start sentinel group: %v", err)
	}
	t.Cleanup(g.Stop)
	return g
}

// dataNode is the spawnSpec of the master (replicaOf "") or of a replica.
// Both can serve a replica, so both sync without touching the disk.
func dataNode(replicaOf string) spawnSpec {
	return spawnSpec{prepare: func(string, string) (string, []string, error) {
		args := []string{"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}
		if replicaOf != "" {
			host, port, err := net.SplitHostPort(replicaOf)
			if err != nil {
				return "", nil, err
			}
			args = append(args, "--replicaof", host, port)
		}
		return "", args, nil
	}}
}

// sentinelNode is the spawnSpec of a sentinel of master. A sentinel rewrites
// its config file as it learns: every start writes it afresh.
func sentinelNode(master string) spawnSpec {
	return spawnSpec{prepare: func(dir, port string) (string, []string, error) {
		host, mport, err := net.SplitHostPort(master)
		if err != nil {
			return "", nil, err
		}
		conf := strings.Join([]string{
			"port " + port,
			"bind 127.0.0.1",
			"dir " + strconv.Quote(dir),
			fmt.Sprintf("sentinel monitor %s %s %s %d", MasterName, host, mport, sentinelQuorum),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", MasterName, downAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s %d", MasterName, failoverTimeout.Milliseconds()),
		}, "\n") + "\n"
		path := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return "", nil, err
		}
		return path, []string{"--sentinel"}, nil
	}}
}

// startSentinel starts a master, then a replica and waits until it is in
// sync, then three sentinels, and waits until each of them knows the master,
// the replica and the two other sentinels.
func startSentinel() (*SentinelGroup, error) {
	if serverPath() == "" {
		return nil, serverBin.err()
	}
	start := time.Now()
	g := &SentinelGroup{MasterName: MasterName}
	master, err := spawn(dataNode(""))
	if err != nil {
		return nil, fmt.Errorf("master: %w", err)
	}
	g.Data = append(g.Data, master)
	replica, err := spawn(dataNode(master.Addr))
	if err != nil {
		g.Stop()
		return nil, fmt.Errorf("replica: %w", err)
	}
	g.Data = append(g.Data, replica)
	err = waitFor(15*time.Second, "master_link_status:up on the replica", func(ctx context.Context) (bool, string) {
		info, err := nodeCmd(ctx, replica.Addr, "INFO", "replication")
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(info.(string), "master_link_status:up"), "master link down"
	})
	if err != nil {
		g.Stop()
		return nil, err
	}
	if g.Sentinels, err = spawnAll(sentinelCount, sentinelNode(master.Addr)); err != nil {
		g.Stop()
		return nil, fmt.Errorf("sentinels: %w", err)
	}
	for _, s := range g.Sentinels {
		g.SentinelAddrs = append(g.SentinelAddrs, s.Addr)
	}
	if err := g.waitAgreed(master.Addr, replica.Addr); err != nil {
		g.Stop()
		return nil, err
	}
	g.Took = time.Since(start)
	return g, nil
}

// waitAgreed waits until every sentinel reports master as the master, knows
// replica as a healthy replica, and knows the other sentinels: only then can
// the group fail over.
func (g *SentinelGroup) waitAgreed(master, replica string) error {
	return waitFor(setupWait, "agreement of the sentinels", func(ctx context.Context) (bool, string) {
		for _, addr := range g.SentinelAddrs {
			if why := g.checkSentinel(ctx, addr, master, replica); why != "" {
				return false, fmt.Sprintf("sentinel %s: %s", addr, why)
			}
		}
		return true, ""
	})
}

// checkSentinel says why the sentinel at addr is not ready, or "".
func (g *SentinelGroup) checkSentinel(ctx context.Context, addr, master, replica string) string {
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer sc.Close()
	hp, err := sc.GetMasterAddrByName(ctx, g.MasterName).Result()
	if err != nil {
		return "master: " + err.Error()
	}
	if got := net.JoinHostPort(hp[0], hp[1]); got != master {
		return "master " + got + ", want " + master
	}
	replicas, err := sc.Replicas(ctx, g.MasterName).Result()
	if err != nil {
		return "replicas: " + err.Error()
	}
	if len(replicas) != 1 {
		return fmt.Sprintf("%d replicas known, want 1", len(replicas))
	}
	r := replicas[0]
	if got := net.JoinHostPort(r["ip"], r["port"]); got != replica || r["flags"] != "slave" || r["master-link-status"] != "ok" {
		return fmt.Sprintf("replica %s flags %q link %q, want %s flags \"slave\" link \"ok\"", got, r["flags"], r["master-link-status"], replica)
	}
	others, err := sc.Sentinels(ctx, g.MasterName).Result()
	if err != nil {
		return "sentinels: " + err.Error()
	}
	if len(others) != sentinelCount-1 {
		return fmt.Sprintf("%d other sentinels known, want %d", len(others), sentinelCount-1)
	}
	return ""
}

// Client returns a failover client (redis.NewFailoverClient) that t closes
// when it ends.
func (g *SentinelGroup) Client(t testing.TB) *redis.Client {
	return g.ClientOpts(t, &redis.FailoverOptions{})
}

// ClientOpts is Client with options; MasterName and SentinelAddrs are set
// by the group.
func (g *SentinelGroup) ClientOpts(t testing.TB, o *redis.FailoverOptions) *redis.Client {
	o.MasterName = g.MasterName
	o.SentinelAddrs = append([]string(nil), g.SentinelAddrs...)
	c := redis.NewFailoverClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// MasterAddr returns the master's address as the first sentinel that
// answers reports it.
func (g *SentinelGroup) MasterAddr(ctx context.Context) (string, error) {
	var errs []error
	for _, addr := range g.SentinelAddrs {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
		hp, err := sc.GetMasterAddrByName(ctx, g.MasterName).Result()
		sc.Close()
		if err == nil {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
		errs = append(errs, fmt.Errorf("sentinel %s: %w", addr, err))
	}
	return "", errors.Join(errs...)
}

// Master returns the server that the sentinels report as master.
func (g *SentinelGroup) Master(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr, err := g.MasterAddr(ctx)
	if err != nil {
		t.Fatalf("sentinel group: master: %v", err)
	}
	for _, s := range g.Data {
		if s.Addr == addr {
			return s
		}
	}
	t.Fatalf("sentinel group: the sentinels report %s as master, not one of the group's servers", addr)
	return nil
}

// KillMaster kills the current master with SIGKILL, by pid, and waits until
// every sentinel reports another server as master and that server says it is
// one. It returns the new master's address and the time from the kill until
// then. It fails t when no failover happens within 20 s.
func (g *SentinelGroup) KillMaster(t testing.TB) (newAddr string, took time.Duration) {
	t.Helper()
	old := g.Master(t)
	start := time.Now()
	old.Kill()
	err := waitFor(setupWait, "failover from "+old.Addr, func(ctx context.Context) (bool, string) {
		newAddr = ""
		for _, addr := range g.SentinelAddrs {
			sc := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
			hp, err := sc.GetMasterAddrByName(ctx, g.MasterName).Result()
			sc.Close()
			if err != nil {
				return false, fmt.Sprintf("sentinel %s: %v", addr, err)
			}
			got := net.JoinHostPort(hp[0], hp[1])
			switch {
			case got == old.Addr:
				return false, fmt.Sprintf("sentinel %s still reports %s", addr, got)
			case newAddr != "" && got != newAddr:
				return false, fmt.Sprintf("sentinels disagree: %s and %s", newAddr, got)
			}
			newAddr = got
		}
		info, err := nodeCmd(ctx, newAddr, "INFO", "replication")
		if err != nil {
			return false, fmt.Sprintf("new master %s: %v", newAddr, err)
		}
		return strings.Contains(info.(string), "role:master"), "new master " + newAddr + " is not master yet"
	})
	if err != nil {
		t.Fatalf("sentinel group: %v", err)
	}
	return newAddr, time.Since(start)
}

// DetachReplicas cuts replication from the current master until the next
// failover: the replicas miss every write from now on, as replicas that lag
// behind do, and a failover loses those writes. The replicas stay healthy
// for the sentinels and can be promoted. (Each replica is made to send a
// password the master does not take, then the master drops its link; the
// sentinels wait longer before they call the master down: see
// detachedDownAfter.)
func (g *SentinelGroup) DetachReplicas(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	master := g.Master(t)
	var replicas []*Server
	for _, s := range g.Data {
		if s != master && !s.exited() {
			replicas = append(replicas, s)
		}
	}
	for _, r := range replicas {
		if _, err := nodeCmd(ctx, r.Addr, "CONFIG", "SET", "masterauth", NewPrefix()); err != nil {
			t.Fatalf("sentinel group: replica %s: %v", r.Addr, err)
		}
	}
	if _, err := nodeCmd(ctx, master.Addr, "CLIENT", "KILL", "TYPE", "replica"); err != nil {
		t.Fatalf("sentinel group: master %s: CLIENT KILL TYPE replica: %v", master.Addr, err)
	}
	for _, addr := range g.SentinelAddrs {
		if _, err := nodeCmd(ctx, addr, "SENTINEL", "SET", g.MasterName, "down-after-milliseconds", detachedDownAfter.Milliseconds()); err != nil {
			t.Fatalf("sentinel group: sentinel %s: %v", addr, err)
		}
	}
	for _, r := range replicas {
		err := waitFor(5*time.Second, "master_link_status:down on replica "+r.Addr, func(ctx context.Context) (bool, string) {
			info, err := nodeCmd(ctx, r.Addr, "INFO", "replication")
			if err != nil {
				return false, err.Error()
			}
			return strings.Contains(info.(string), "master_link_status:down"), "link up"
		})
		if err != nil {
			t.Fatalf("sentinel group: %v", err)
		}
	}
}

// exited reports whether the server's process has ended (KillMaster).
func (s *Server) exited() bool {
	select {
	case <-s.exit:
		return true
	default:
		return false
	}
}

// Prefix returns a fresh key prefix (NewPrefix) whose keys are deleted from
// the master of the time when t ends.
func (g *SentinelGroup) Prefix(t testing.TB) string {
	p := NewPrefix()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if addr, err := g.MasterAddr(ctx); err == nil {
			deleteKeys(addr, p)
		}
	})
	return p
}

// Stop ends the sentinels, then the master and the replica (see Server.Stop).
// Sentinels go first so that they start no failover while the group stops.
func (g *SentinelGroup) Stop() {
	stopParallel(g.Sentinels)
	stopParallel(g.Data)
}
