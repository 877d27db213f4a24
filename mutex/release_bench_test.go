package mutex

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// bareRelease is the classic compare-and-delete, the least a release can do.
var bareRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkReleaseScript measures what a release costs Redis itself: the
// EVALSHA time per call in commandstats (which includes the commands the
// script calls), for the common release (unlock.lua, which also writes the
// release's record) and for a bare compare-and-delete, on the same name. The lock is set with a native SET before each call, outside
// the measure. Rerun: go test -run '^$' -bench ReleaseScript -count 5 ./mutex
func BenchmarkReleaseScript(b *testing.B) {
	be := testutil.RealBackend(b)
	c := be.Client(b)
	ctx := context.Background()
	r := recordRig{c: c, b: be, name: "bench"}
	token := tok('b')
	n := r.names(token)
	var seq uint64
	cases := []struct {
		name string
		run  func() (any, error)
	}{
		{"unlock.lua", func() (any, error) {
			seq++
			st := stampOf(1, seq, seq) // every earlier release has its reply
			return unlockScript.Run(ctx, c, []string{n.key, n.nkey, n.tkey}, st.unlockArgs(n.value, token)...).Result()
		}},
		{"compare-and-delete", func() (any, error) {
			return bareRelease.Run(ctx, c, []string{n.key}, n.value).Result()
		}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			calls0, usec0 := evalshaStats(b, c)
			for b.Loop() {
				if err := c.Set(ctx, n.key, n.value, time.Minute).Err(); err != nil {
					b.Fatal(err)
				}
				if reply, err := tc.run(); err != nil || (reply != any(int64(0)) && reply != any(int64(1))) {
					b.Fatalf("release: %v, %v", reply, err)
				}
			}
			calls, usec := evalshaStats(b, c)
			if calls > calls0 {
				b.ReportMetric(float64(usec-usec0)/float64(calls-calls0), "server-µs/release")
			}
		})
	}
}

// evalshaStats reads the server's EVALSHA calls and microseconds so far.
func evalshaStats(b *testing.B, c *redis.Client) (calls, usec int64) {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return calls, usec
}
