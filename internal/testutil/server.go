package testutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RequireEnv names the variable that makes a missing server (or CLI, see
// ServerEnv and CLIEnv) a failure.
const RequireEnv = "FUNNELGUARD_REQUIRE_REDIS"

// A Server is a server process (redis-server, or what ServerEnv names) on a
// loopback port, with its own temporary directory, no persistence (unless
// started with StartServerArgs), and nothing but this test binary talking to
// it.
type Server struct {
	Addr string // 127.0.0.1:port
	dir  string
	spec spawnSpec
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has been waited for
}

// spawnSpec is what a server needs beyond the common flags (a cluster node, a
// replica, a sentinel). The zero value is a plain server.
type spawnSpec struct {
	// prepare, if set, runs before every start (a retry on another port, a
	// Restart) with the server's directory and port. It returns a config file
	// to load, or "", and flags to pass after the common ones, which they
	// override.
	prepare func(dir, port string) (conf string, args []string, err error)
}

// NeedServer skips t when the server binary (ServerEnv, redis-server by
// default) is not installed, or fails it when FUNNELGUARD_REQUIRE_REDIS=1.
func NeedServer(t testing.TB) {
	t.Helper()
	if serverPath() != "" {
		return
	}
	missing(t, serverBin.missing())
}

// missing skips t for want of a program, or fails it when
// FUNNELGUARD_REQUIRE_REDIS=1.
func missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s, and %s=1", msg, RequireEnv)
	}
	t.Skip(msg)
}

// StartServer starts a server for t alone and stops it when t ends.
// Use it for tests that stop, kill or pause the server; other tests share one
// server through Backends or Real.
func StartServer(t testing.TB) *Server {
	t.Helper()
	NeedServer(t)
	s, err := Spawn()
	if err != nil {
		t.Fatalf("start %s: %v", ServerName(), err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartServerArgs is StartServer with args passed after the common flags,
// which they override, such as "--appendonly", "yes", "--appendfsync",
// "always" for a server that persists. Its files (RDB, AOF) go to the
// server's temporary directory, which Restart keeps, so that a restarted
// server reloads them, and which Stop removes when t ends.
func StartServerArgs(t testing.TB, args ...string) *Server {
	t.Helper()
	NeedServer(t)
	args = slices.Clone(args)
	s, err := spawn(spawnSpec{prepare: func(string, string) (string, []string, error) { return "", args, nil }})
	if err != nil {
		t.Fatalf("start %s %v: %v", ServerName(), args, err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartServers starts n servers for t alone, in parallel, and stops them
// when t ends. It skips (or fails) t from t's own goroutine when the server
// binary is missing: a t.Skip from a spawning goroutine would not skip.
func StartServers(t testing.TB, n int) []*Server {
	t.Helper()
	NeedServer(t)
	srvs := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { srvs[i], errs[i] = Spawn() })
	}
	wg.Wait()
	for _, s := range srvs {
		if s != nil {
			t.Cleanup(s.Stop)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("start %d of %s: %v", n, ServerName(), err)
	}
	return srvs
}

// Spawn starts a server (ServerEnv, redis-server by default) on a free
// loopback port outside any test (the bench program uses it); the caller must
// Stop it. It fails when the binary is not found.
func Spawn() (*Server, error) { return spawn(spawnSpec{}) }

// spawn is Spawn for any kind of server.
func spawn(spec spawnSpec) (*Server, error) {
	if serverPath() == "" {
		return nil, serverBin.err()
	}
	dir, err := os.MkdirTemp("", "funnelguard-redis-")
	if err != nil {
		return nil, err
	}
	var last error
	for try := 0; try < 5; try++ { // a free port can be taken between our probe and the server's bind
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, spec: spec}
		if last = s.start(); last == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, last
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start runs the server binary on s.Addr and waits until it answers, as itself
// (answers).
func (s *Server) start() error {
	_, port, _ := net.SplitHostPort(s.Addr)
	var conf string
	var extra []string
	if s.spec.prepare != nil {
		var err error
		if conf, extra, err = s.spec.prepare(s.dir, port); err != nil {
			return err
		}
	}
	var args []string
	if conf != "" {
		args = append(args, conf) // the server takes the config file first
	}
	args = append(args,
		"--bind", "127.0.0.1", "--port", port,
		"--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"),
		"--daemonize", "no")
	cmd := exec.Command(serverPath(), append(args, extra...)...)
	// If the test binary dies without cleaning up, the kernel ends the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd, s.exit = cmd, make(chan struct{})
	go func(exit chan struct{}) { _ = cmd.Wait(); close(exit) }(s.exit)

	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := answers(ctx, c, cmd.Process.Pid)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.exit:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("%s on %s exited: %s", ServerName(), s.Addr, tail(log, 400))
		default:
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("%s on %s did not answer PING: %w", ServerName(), s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// errOtherServer is answers' error when another process serves the address:
// two spawns that probed the same free port, or a port taken while its server
// was down for a Restart. The server we started cannot bind it and exits.
var errOtherServer = errors.New("another server answers on this address")

// answers reports whether the server on c's address answers PING and is the
// process pid: a PING alone would take another server on the same port for
// ours while ours is still starting (and about to fail to bind), and the test
// would then kill or restart a process that serves nothing.
func answers(ctx context.Context, c *redis.Client, pid int) error {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if v != strconv.Itoa(pid) {
				return fmt.Errorf("%w: pid %s, not %d", errOtherServer, v, pid)
			}
			return nil
		}
	}
	return errors.New("INFO server has no process_id")
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Pid returns the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Client returns a client of the server that t closes when it ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// Kill ends the server with SIGKILL, by pid, and waits for it.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exit
}

// Restart kills the server (SIGKILL) and starts a new one on the same
// address and directory: empty, unless its flags made it persist (see
// StartServerArgs), then with what it had written to disk.
func (s *Server) Restart() error {
	s.Kill()
	return s.start()
}

// Stop ends the server (SIGTERM, then SIGKILL after 5 s) and removes its directory.
func (s *Server) Stop() {
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exit:
		case <-time.After(5 * time.Second):
			s.Kill()
		}
	}
	os.RemoveAll(s.dir)
}
