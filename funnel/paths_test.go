package funnel_test

// TestPathFiles is a measurement, not a check: it runs only with
// FUNNEL_PATH set to one of AllowN's paths. FUNNEL_PATH_CALL=1 makes the
// path's call after the setup, 0 only the setup; the library files whose
// statement counts grow between the two coverage profiles are the files
// the call walks through:
//
//	pkgs=./funnel/,./mutex/,./internal/ctxcall/,./internal/forgetful/,./internal/keyspace/,./internal/nilcheck/,./internal/outage/,./internal/reach/
//	for c in 0 1; do
//		FUNNEL_PATH=fresh FUNNEL_PATH_CALL=$c go test -count=1 -run '^TestPathFiles$' \
//			-covermode=count -coverpkg=$pkgs -coverprofile=/tmp/path.$c.out ./funnel/
//		tail -n +2 /tmp/path.$c.out | awk '{split($1,a,":"); f[a[1]]+=$3} END {for (k in f) print k, f[k]}' | sort >/tmp/path.$c.sum
//	done
//	join -a2 -e0 -o 0,1.2,2.2 /tmp/path.0.sum /tmp/path.1.sum | awk '$3>$2 {print $1}'

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

func TestPathFiles(t *testing.T) {
	path := os.Getenv("FUNNEL_PATH")
	if path == "" {
		t.Skip("measurement only")
	}
	call := os.Getenv("FUNNEL_PATH_CALL") == "1"
	b := testutil.RealBackend(t)
	ctx := context.Background()
	rule := funnel.AtMost(3, time.Hour)
	allow := func(lim *funnel.Limiter, key string) funnel.Result {
		res, err := lim.Allow(ctx, key, rule)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	warm := func(lim *funnel.Limiter) {
		for range 2 { // every script loaded, the connection open, a clock sample
			allow(lim, "warm-up")
		}
	}
	switch path {
	case "fresh": // a key with no state, lock free: admit.lua
		lim := newLimiter(t, b)
		warm(lim)
		if call {
			allow(lim, "k")
		}
	case "returning": // a key this Limiter saw: returning.lua
		lim := newLimiter(t, b)
		warm(lim)
		allow(lim, "k")
		if call {
			allow(lim, "k")
		}
	case "lock": // a key with state written elsewhere: the lock, two round trips
		lim, other := newLimiter(t, b), newLimiter(t, b)
		warm(lim)
		allow(other, "k")
		if call {
			allow(lim, "k")
		}
	case "uniform": // WithUniformCost: always the lock
		lim := newLimiter(t, b, funnel.WithUniformCost())
		warm(lim)
		allow(lim, "k")
		if call {
			allow(lim, "k")
		}
	case "deny": // a key with no room, state written elsewhere: one round trip
		lim, other := newLimiter(t, b), newLimiter(t, b)
		warm(lim)
		for range 3 {
			allow(other, "k")
		}
		if call {
			if allow(lim, "k").Allowed {
				t.Fatal("admitted")
			}
		}
	case "denycache": // a cached denial
		lim := newLimiter(t, b, funnel.WithDenyCache(10))
		warm(lim)
		for range 4 {
			allow(lim, "k")
		}
		if call {
			if allow(lim, "k").Allowed {
				t.Fatal("admitted")
			}
		}
	case "crowded": // a crowded key: read.lua, commit.lua, no lock
		lim := newLimiter(t, b)
		warm(lim)
		allow(lim, "k")
		if err := funnel.LoadScripts(ctx, b.Client(t)); err != nil {
			t.Fatal(err)
		}
		if err := funnel.SetCrowded(lim, "k", rule); err != nil {
			t.Fatal(err)
		}
		if call {
			allow(lim, "k")
		}
	case "batch": // a leader and two calls that join its batch
		lim, _, release, watch := heldLimiter(t, b, rule, "hot")
		if call {
			var wg sync.WaitGroup
			for range 3 {
				wg.Go(func() { _, _ = lim.Allow(ctx, "hot", rule) })
			}
			awaitJoins(t, watch, 2)
			release()
			wg.Wait()
		}
		release()
	default:
		t.Fatalf("unknown path %q", path)
	}
}
