package mutex

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

// The scripts find a handle in a re-entered lock's list between commas:
// handle 1 is not open because 11 is, and closing 11 leaves 0 and the mark.
// (The Locker never sends a closed handle; a stale or confused caller, or a
// quorum node that missed a release, could.)
func TestScriptsMatchWholeHandleIDs(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		key := b.Prefix + "{h}:lock"
		token := strings.Repeat("a", tokenLen)
		if err := c.Set(ctx, key, lockValue(token, true, "0", "11"), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		release := func(id string) [3]int64 {
			t.Helper()
			reply, err := releaseScript.Run(ctx, c, []string{key, b.Prefix + "{h}:record", b.Prefix + "{h}:record:" + token}, token, id, "", 0, 0, noStamp.owner, noStamp.seq, noStamp.mark).Result()
			if err != nil {
				t.Fatalf("release %s: %v", id, err)
			}
			r, _, err := ints(reply, 2)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		for _, id := range []string{"1", "01", "1,", ",0"} {
			if pttl, err := pttlScript.Run(ctx, c, []string{key}, token, id).Int64(); err != nil || pttl != -3 {
				t.Fatalf("pttl of handle %q = %v, %v; want -3 (not open)", id, pttl, err)
			}
			if r := release(id); r[0] != -1 {
				t.Fatalf("release of handle %q = %v; want -1 (not open)", id, r)
			}
		}
		if v := c.Get(ctx, key).Val(); v != lockValue(token, true, "0", "11") {
			t.Fatalf("releases of handles that are not open changed the lock to %q", v)
		}
		if r := release("11"); r[0] != 1 {
			t.Fatalf("release of handle 11 = %v; want 1 handle left", r)
		}
		if v := c.Get(ctx, key).Val(); v != lockValue(token, true, "0") {
			t.Fatalf("after closing 11 the lock holds %q", v)
		}
		if r := release("0"); r[0] != 0 {
			t.Fatalf("release of the last handle = %v", r)
		}
		if n := c.Exists(ctx, key).Val(); n != 0 {
			t.Fatal("the last release left the lock")
		}
	})
}
