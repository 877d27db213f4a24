package main

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// serverStats is what INFO commandstats says of the server so far. Redis
// counts a command called from a script in its own line as well as in the
// EVALSHA's (calls and usec), so inner and scripts split a script's work.
type serverStats struct {
	usec       int64 // time in commands, µs: a script's inner commands count twice
	inner      int64 // calls of every other command than scripts', INFO and a connection's set-up
	scripts    int64 // EVAL and EVALSHA calls (_RO included)
	scriptUsec int64 // time in EVAL and EVALSHA, µs (their inner commands included, once)
	publish    int64 // PUBLISH calls (from scripts included): Pub/Sub messages sent
	// cpuUsec is the CPU time of the server's main thread, µs (INFO cpu,
	// user + sys): unlike usec, not inflated when the OS deschedules Redis
	// mid-command on a loaded machine, but it includes reading requests and
	// writing replies.
	cpuUsec int64
}

// minus is s less an earlier reading.
func (s serverStats) minus(o serverStats) serverStats {
	return serverStats{usec: s.usec - o.usec, inner: s.inner - o.inner, scripts: s.scripts - o.scripts,
		scriptUsec: s.scriptUsec - o.scriptUsec, publish: s.publish - o.publish, cpuUsec: s.cpuUsec - o.cpuUsec}
}

// plus is s with a later delta o added.
func (s serverStats) plus(o serverStats) serverStats {
	return serverStats{usec: s.usec + o.usec, inner: s.inner + o.inner, scripts: s.scripts + o.scripts,
		scriptUsec: s.scriptUsec + o.scriptUsec, publish: s.publish + o.publish, cpuUsec: s.cpuUsec + o.cpuUsec}
}

// readServerStats reads INFO commandstats and cpu on c (the zero value if
// it fails). The INFO is counted by the next reading, in usec only.
func readServerStats(ctx context.Context, c *redis.Client) serverStats {
	info, err := c.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return serverStats{}
	}
	var s serverStats
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && (k == "used_cpu_user_main_thread" || k == "used_cpu_sys_main_thread") {
			sec, _ := strconv.ParseFloat(v, 64)
			s.cpuUsec += int64(sec * 1e6)
			continue
		}
		stat, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, rest, _ := strings.Cut(stat, ":")
		calls, usec := statField(rest, "calls="), statField(rest, "usec=")
		s.usec += usec
		switch cmd, _, _ := strings.Cut(name, "|"); cmd {
		case "eval", "evalsha", "eval_ro", "evalsha_ro":
			s.scripts += calls
			s.scriptUsec += usec
		case "script", "info", "hello", "client", "auth", "select":
			// SCRIPT LOAD after a NOSCRIPT, our INFO, go-redis's HELLO and
			// CLIENT SETINFO on each new connection: not the operation's.
		case "publish":
			s.publish += calls
			s.inner += calls
		default:
			s.inner += calls
		}
	}
	return s
}

// statField is the integer after key in a commandstats line's rest
// ("calls=3,usec=12,..."), 0 if absent.
func statField(rest, key string) int64 {
	for f := range strings.SplitSeq(rest, ",") {
		if v, ok := strings.CutPrefix(f, key); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
