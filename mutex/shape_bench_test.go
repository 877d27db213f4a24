//go:build unix

package mutex

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// obtainShape is an acquisition as a script: a SET NX PX inside Lua, the
// shape of redislock's obtain (written here, not imported).
var obtainShape = redis.NewScript(`if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0`)

// wideRelease is the compare-and-delete of bareRelease taking unlock.lua's
// keys and arguments (it reads only the first of each).
var wideRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) return 0 end return 2`)

// BenchmarkCycleShapes splits a serial Lock+Unlock cycle's cost by the shape
// of its two commands, each step one thing more than the one before, on one
// name, in turn (100 cycles of each per round, so the machine's drift hits
// all alike): per cycle, wall time (ns), and the CPU time of redis-server
// (INFO cpu) and of this process (getrusage), which include the system
// calls and the parsing that commandstats leaves out.
//
//	setnx+del        native SET NX PX, then DEL: the least a cycle does
//	obtain+del       the acquisition as a script instead (SET NX in Lua)
//	setnx+cad        the release as the classic compare-and-delete, 1 key 1 arg
//	setnx+cad-300B   the same with one more argument, 300 bytes long
//	setnx+cad-wide   the same script given unlock.lua's 3 keys and 4 arguments
//	setnx+unlock-norecord  unlock.lua without its release record
//	setnx+unlock     unlock.lua: funnelguard's commands
//
// Rerun: go test -run '^$' -bench CycleShapes -benchtime 100x -count 3 ./mutex
func BenchmarkCycleShapes(b *testing.B) {
	be := testutil.RealBackend(b)
	c := be.ClientOpts(b, &redis.Options{ContextTimeoutEnabled: true})
	l := mustNew(b, c, WithPrefix(be.Prefix))
	ctx := context.Background()
	n := l.names("shapes")
	keys := []string{n.key, n.nkey, n.tkey}
	noRecord := redis.NewScript(strings.Split(unlockSrc, "local old =")[0] + "return 0")
	var seq uint64
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	setnx := func() {
		ok, err := c.SetNX(ctx, n.key, n.value, DefaultTTL).Result()
		must(err)
		if !ok {
			b.Fatal("lock held")
		}
	}
	obtain := func() { must(obtainShape.Run(ctx, c, keys[:1], n.value, DefaultTTL.Milliseconds()).Err()) }
	del := func() { must(c.Del(ctx, n.key).Err()) }
	// release runs s on keys with the arguments args returns, each call.
	release := func(s *redis.Script, keys []string, args func() []any) func() {
		return func() {
			r, err := s.Run(ctx, c, keys, args()...).Result()
			must(err)
			if r != any(int64(0)) {
				b.Fatalf("release: %v", r)
			}
		}
	}
	narrow := func() []any { return []any{n.value} }
	pad := strings.Repeat("x", 300)
	padded := func() []any { return []any{n.value, pad} }
	wide := func() []any { // unlock.lua's, renewed each call as an Unlock does
		seq++
		return stampOf(7, seq, seq).unlockArgs(n.value, n.token)
	}
	shapes := []struct {
		name             string
		acquire, release func()
	}{
		{"setnx+del", setnx, del},
		{"obtain+del", obtain, del},
		{"setnx+cad", setnx, release(wideRelease, keys[:1], narrow)},
		{"setnx+cad-300B", setnx, release(wideRelease, keys[:1], padded)},
		{"setnx+cad-wide", setnx, release(wideRelease, keys, wide)},
		{"setnx+unlock-norecord", setnx, release(noRecord, keys, wide)},
		{"setnx+unlock", setnx, release(unlockScript, keys, wide)},
	}
	wall := make([]time.Duration, len(shapes))
	srv := make([]float64, len(shapes))
	cli := make([]time.Duration, len(shapes))
	cycles := 0
	const per = 100
	for b.Loop() {
		for i, s := range shapes {
			s0, c0 := serverCPU(b, c), processCPU()
			t0 := time.Now()
			for range per {
				s.acquire()
				s.release()
			}
			wall[i] += time.Since(t0)
			srv[i] += serverCPU(b, c) - s0
			cli[i] += processCPU() - c0
		}
		cycles += per
	}
	for i, s := range shapes {
		b.ReportMetric(float64(wall[i].Nanoseconds())/float64(cycles), s.name+"-ns")
		b.ReportMetric(srv[i]*1e9/float64(cycles), s.name+"-server-cpu-ns")
		b.ReportMetric(float64(cli[i].Nanoseconds())/float64(cycles), s.name+"-client-cpu-ns")
	}
}

// serverCPU returns redis-server's CPU time so far, in seconds.
func serverCPU(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			sum += f
		}
	}
	return sum
}

// processCPU returns this process's CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
