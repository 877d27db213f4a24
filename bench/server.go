package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// A server is a redis-server process this program started on a loopback
// port, with its own temporary directory and no persistence.
type server struct {
	addr string
	cmd  *exec.Cmd
	dir  string
}

// startServer spawns redis-server on a free loopback port and waits until it
// answers PING. It fails with a clear error when redis-server is not on PATH.
func startServer() (*server, error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server is not installed (apt-get install redis-server), or pass -redis 127.0.0.1:6379")
	}
	dir, err := os.MkdirTemp("", "fgbench-redis-")
	if err != nil {
		return nil, err
	}
	var last error
	for range 5 { // the free port can be taken between the probe and the bind
		port, err := freePort()
		if err != nil {
			last = err
			continue
		}
		s := &server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir}
		s.cmd = exec.Command(path, "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
			"--save", "", "--appendonly", "no", "--dir", dir)
		if last = s.cmd.Start(); last != nil {
			continue
		}
		if last = s.waitReady(); last == nil {
			return s, nil
		}
		s.kill()
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("start redis-server: %w", last)
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitReady polls PING for up to 5 s, and gives up early if the process exits.
func (s *server) waitReady() error {
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server on %s exited: %v", s.addr, err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer PING: %w", s.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill stops the process by its pid (the one this program started).
func (s *server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
	}
}

// stop kills the server and removes its directory.
func (s *server) stop() {
	s.kill()
	_ = os.RemoveAll(s.dir)
}

// checkLoopback refuses any address whose host is not a loopback IP or
// "localhost": the benchmark floods the server and deletes keys.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-redis %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-redis %q: only loopback addresses are allowed", addr)
	}
	return nil
}
