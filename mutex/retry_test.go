package mutex

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// go-redis runs a script again when its reply was lost (MaxRetries): each
// lock script must answer the second run as it answered the first.
func TestScriptsAnswerARetryAsTheFirstRun(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		key, fkey := b.Prefix+"{r}:lock", b.Prefix+"{r}:fence"
		token := strings.Repeat("b", tokenLen)
		nkey, tkey := b.Prefix+"{r}:record", b.Prefix+"{r}:record:"+token
		run := func(script *redis.Script, keys []string, args ...any) []any {
			t.Helper()
			reply, err := script.Run(ctx, c, keys, args...).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n, ok := reply.(int64); ok { // a plain release's short reply
				return []any{n, int64(0)}
			}
			return reply.([]any)
		}

		// A fresh acquire, twice: the second finds its own token.
		first := run(acquireScript, []string{key, fkey}, token, "", 60000, 60000)
		again := run(acquireScript, []string{key, fkey}, token, "", 60000, 60000)
		if first[0] != int64(1) || again[0] != int64(1) || again[2] != first[2] {
			t.Fatalf("acquire, then the same again = %v, %v; want both held with one fence", first, again)
		}
		// Another token is refused all the same.
		if r := run(acquireScript, []string{key, fkey}, strings.Repeat("c", tokenLen), "", 60000, 60000); r[0] != int64(0) {
			t.Fatalf("another token's acquire = %v, want refused", r)
		}
		// A re-entry, twice: the handle is listed once, and one release of
		// it leaves the root alone.
		run(acquireScript, []string{key, fkey}, token, "7", 60000, 60000)
		run(acquireScript, []string{key, fkey}, token, "7", 60000, 60000)
		if v := c.Get(ctx, key).Val(); v != lockValue(token, false, "0", "7") {
			t.Fatalf("after a re-entry run twice the lock holds %q", v)
		}

		// A release, twice: the second replays the first from its record.
		rel := append([]any{token, "7", "", 0, 60000}, stampOf(0xab, 1, 1).args()...)
		r1 := run(releaseScript, []string{key, nkey, tkey, fkey}, rel...)
		r2 := run(releaseScript, []string{key, nkey, tkey, fkey}, rel...)
		if r1[0] != int64(1) || r2[0] != int64(1) {
			t.Fatalf("release of handle 7, twice = %v, %v; want 1 handle left both times", r1, r2)
		}
		if v := c.Get(ctx, key).Val(); v != lockValue(token, false, "0") {
			t.Fatalf("after a release run twice the lock holds %q", v)
		}
		// Another call (handle 0) is not answered from 7's record.
		r3 := run(releaseScript, []string{key, nkey, tkey, fkey}, append([]any{token, "0", "", 0, 60000}, stampOf(0xab, 2, 1).args()...)...)
		if r3[0] != int64(0) || c.Exists(ctx, key).Val() != 0 {
			t.Fatalf("release of the root = %v; want the last handle closed and the lock gone", r3)
		}
		// The root's release again: replayed; a different call is not.
		if r := run(releaseScript, []string{key, nkey, tkey, fkey}, append([]any{token, "0", "", 0, 60000}, stampOf(0xab, 2, 1).args()...)...); r[0] != int64(0) {
			t.Fatalf("the root's release again = %v, want its first reply (0 left)", r)
		}
		if r := run(releaseScript, []string{key, nkey, tkey, fkey}, append([]any{token, "0", strings.Repeat("d", tokenLen), 1000, 60000}, stampOf(0xab, 3, 1).args()...)...); r[0] != int64(-1) {
			t.Fatalf("a different release (a hand-over) of the released root = %v, want -1 (not held)", r)
		}
		// Handle 7's release went to the name's record key (free), the
		// root's to the token's (handle 7's release, number 1, had no reply
		// as far as mark 1 says). The token's key lasts recordTTL; the
		// name's, shared by releases, at least that and at most 3 times.
		if ttl := c.PTTL(ctx, tkey).Val(); ttl <= 0 || ttl > recordTTL {
			t.Fatalf("the token's release record has TTL %v, want (0, %v]", ttl, recordTTL)
		}
		if ttl := c.PTTL(ctx, nkey).Val(); ttl < recordTTL-time.Second || ttl > 3*recordTTL {
			t.Fatalf("the name's release record has TTL %v, want [%v, %v]", ttl, recordTTL-time.Second, 3*recordTTL)
		}
	})
}

// UnlockWith run twice with the same call replays the fragment's result
// and does not run it again; results of every kind the record keeps.
func TestFragmentReleaseReplay(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		frag := NewFragment(`local n = redis.call('INCR', KEYS[1])
if ARGV[1] == 'n' then return n end
if ARGV[1] == 's' then return 'v:' .. n end
if ARGV[1] == 't' then return true end
if ARGV[1] == 'f' then return false end
return {n}`)
		for _, kind := range []string{"n", "s", "t", "f", "x"} {
			key, ctr := b.Prefix+"{"+kind+"}:lock", b.Prefix+"{"+kind+"}:ctr"
			token := strings.Repeat(kind, tokenLen)
			n := names{key: key, nkey: b.Prefix + "{" + kind + "}:record", tkey: b.Prefix + "{" + kind + "}:record:" + token}
			if err := c.Set(ctx, key, lockValue(token, false), time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			keys, args := scriptCall(&Call{Fragment: frag, Keys: []string{ctr}, Args: []any{kind}}, &n, true, append([]any{token, "0", "", 0, 0}, stampOf(0xab, 1, 1).args()...)...)
			r1, err1 := frag.release.Run(ctx, c, keys, args...).Slice()
			r2, err2 := frag.release.Run(ctx, c, keys, args...).Slice()
			if err1 != nil || err2 != nil {
				t.Fatalf("%s: %v, %v", kind, err1, err2)
			}
			if n := c.Get(ctx, ctr).Val(); n != "1" {
				t.Fatalf("%s: the fragment ran %s times", kind, n)
			}
			if len(r2) < 4 || r2[3] == nil {
				t.Fatalf("%s: the second run %v is not a replay", kind, r2)
			}
			switch kind {
			case "x": // a table is not kept
				if r2[3] != int64(2) {
					t.Fatalf("x: replay %v, want flag 2 (result not kept)", r2)
				}
			default:
				if r1[2] != r2[2] || r2[3] != int64(1) {
					t.Fatalf("%s: first %v, replay %v; want the same result", kind, r1, r2)
				}
			}
		}
	})
}

// A server that refuses scripts must not hand out a lock: the native SET
// NX would take it, and no release could ever free it.
func TestNoLockWithoutScripts(t *testing.T) {
	srv := testutil.StartServer(t)
	ctx := context.Background()
	admin := srv.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "&*", "+@all", "-@scripting").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "noscripts", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	l := mustNew(t, c, WithPrefix(testutil.NewPrefix()))
	lk, err := l.TryLock(ctx, "x")
	if err == nil || lk != nil {
		t.Fatalf("TryLock on a server that refuses scripts = %v, %v; want an error", lk, err)
	}
	if !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("TryLock's error %v does not name the refusal", err)
	}
	if n := admin.Exists(ctx, l.LockKey("x")).Val(); n != 0 {
		t.Fatal("a lock was taken that could not be released")
	}
}

// TestReleaseYieldsToAMarkedLock: a hand-over that ends a chain
// (unlessMarked) goes to the next owner when no waiter marked the lock, and
// when one did, releases the lock to all, publishes, and says so (yielded),
// also when run again after its reply was lost: a replay never tells a
// local waiter that it got a lock it did not get.
func TestReleaseYieldsToAMarkedLock(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		key, fkey := b.Prefix+"{y}:lock", b.Prefix+"{y}:fence"
		next := strings.Repeat("d", tokenLen)
		nkey := b.Prefix + "{y}:record"
		// Each lock is a fresh token's, as each acquisition is.
		rel := func(token string, seq uint64) []any {
			return append([]any{token, "0", unlessMarked + next, 60000, 0}, stampOf(0xab, seq, 1).args()...)
		}
		run := func(args []any) any {
			t.Helper()
			tkey := b.Prefix + "{y}:record:" + args[0].(string)
			reply, err := releaseScript.Run(ctx, c, []string{key, nkey, tkey, fkey}, args...).Result()
			if err != nil {
				t.Fatal(err)
			}
			return reply
		}

		// Unmarked: handed over to next, with the short reply.
		token := strings.Repeat("b", tokenLen)
		c.Set(ctx, key, lockValue(token, false), time.Minute)
		if r := run(rel(token, 1)); r != int64(0) {
			t.Fatalf("hand-over of an unmarked lock = %v, want 0", r)
		}
		if v := c.Get(ctx, key).Val(); v != lockValue(next, false) {
			t.Fatalf("after the hand-over the lock holds %q, want next's", v)
		}

		// Marked: released to all comers, yielded, and the replay says so.
		token = strings.Repeat("c", tokenLen)
		c.Set(ctx, key, lockValue(token, true), time.Minute)
		sub := c.Subscribe(ctx, b.Prefix+"{y}:released")
		defer sub.Close()
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		first := run(rel(token, 2))
		if fmt.Sprint(first) != "[0 0 "+yielded+"]" {
			t.Fatalf("hand-over of a marked lock = %v, want [0 0 %s]", first, yielded)
		}
		if c.Exists(ctx, key).Val() != 0 {
			t.Fatal("a yielded hand-over left the lock in Redis")
		}
		if _, err := sub.ReceiveMessage(ctx); err != nil {
			t.Fatalf("no release published: %v", err)
		}
		again := run(rel(token, 2))
		if fmt.Sprint(again) != "[0 0 "+yielded+" 1]" {
			t.Fatalf("the yielded hand-over run again = %v, want the replay [0 0 %s 1]", again, yielded)
		}
	})
}
