package mutex

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// recordRig runs the release scripts by hand on one name, for tokens of
// chosen owners, so a test can play a lost reply and its retry.
type recordRig struct {
	t    *testing.T
	c    *redis.Client
	b    *testutil.Backend
	name string
}

func (r recordRig) names(token string) *names {
	p := r.b.Prefix + "{" + r.name + "}:"
	return &names{key: p + "lock", nkey: p + "record", tkey: p + "record:" + token, token: token, value: lockValue(token, false)}
}

// take sets token's lock as a native SET NX would.
func (r recordRig) take(token string) {
	r.t.Helper()
	if ok, err := r.c.SetNX(context.Background(), r.names(token).key, lockValue(token, false), time.Minute).Result(); err != nil || !ok {
		r.t.Fatalf("take %s: %v, %v", token[:4], ok, err)
	}
}

// release runs unlock.lua, and release.lua when unlock.lua passes, as
// Lock.Unlock does; it returns the handles left (-1: not held).
func (r recordRig) release(token string, st stamp) int64 {
	r.t.Helper()
	ctx := context.Background()
	n := r.names(token)
	reply, err := unlockScript.Run(ctx, r.c, []string{n.key, n.nkey, n.tkey}, st.unlockArgs(n.value, token)...).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	if reply == any(int64(0)) {
		return 0
	}
	keys, args := scriptCall(nil, n, true, append([]any{token, "0", "", 0, 0}, st.args()...)...)
	if reply, err = releaseScript.Run(ctx, r.c, keys, args...).Result(); err != nil {
		r.t.Fatal(err)
	}
	got, _, err := ints(reply, 2)
	if err != nil {
		r.t.Fatal(err)
	}
	return got[0]
}

func (r recordRig) keys() []string {
	ks, err := r.c.Keys(context.Background(), r.b.Prefix+"*").Result()
	if err != nil {
		r.t.Fatal(err)
	}
	return ks
}

func tok(c byte) string { return strings.Repeat(string(c), tokenLen) }

// A release whose reply was lost is answered from its record when it runs
// again, although other releases of the name came between: those of another
// Locker (which cannot know whether its reply came) and later ones of the
// same Locker while it had not had that reply.
func TestRecordSurvivesReleasesBetweenLostReplyAndRetry(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		r := recordRig{t: t, c: b.Client(t), b: b, name: "n"}
		const a, o = 0xa, 0xb // two Lockers

		// a's release 1: its reply is "lost" (a knows no reply: mark 1).
		r.take(tok('1'))
		if got := r.release(tok('1'), stampOf(a, 1, 1)); got != 0 {
			t.Fatalf("release 1 = %d", got)
		}
		// Locker o takes and releases the name twice; a takes it and
		// releases it again while release 1 still has no reply (mark 1).
		r.take(tok('2'))
		r.release(tok('2'), stampOf(o, 1, 1))
		r.take(tok('3'))
		r.release(tok('3'), stampOf(o, 2, 2))
		r.take(tok('4'))
		r.release(tok('4'), stampOf(a, 2, 1))

		// Every one of them, run again, is answered as a success.
		for i, s := range []struct {
			token string
			stamp stamp
		}{{tok('1'), stampOf(a, 1, 1)}, {tok('2'), stampOf(o, 1, 1)}, {tok('3'), stampOf(o, 2, 2)}, {tok('4'), stampOf(a, 2, 1)}} {
			if got := r.release(s.token, s.stamp); got != 0 {
				t.Errorf("release %d run again = %d, want 0 (from its record)", i+1, got)
			}
		}
		// A token that never held the lock is not answered from anybody's.
		if got := r.release(tok('5'), stampOf(a, 9, 9)); got != -1 {
			t.Errorf("a release by a token that never held the lock = %d, want -1", got)
		}
	})
}

// Once a Locker has had the reply of its release, its next release of the
// name overwrites that record: a name released again and again by one
// Locker keeps one record key, not one per release.
func TestRecordAnsweredReleasesShareOneKey(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		c := b.Client(t)
		l := mustNew(t, c, WithPrefix(b.Prefix))
		ctx := context.Background()
		var last string
		for range 50 {
			lk, err := l.Lock(ctx, "busy")
			if err != nil {
				t.Fatal(err)
			}
			last = lk.Token()
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		r := recordRig{t: t, c: c, b: b, name: "busy"}
		if ks := r.keys(); len(ks) != 1 || ks[0] != InternalKey(l, "busy", "record") {
			t.Fatalf("after 50 releases of one name the keys are %v; want the name's record alone", ks)
		}
		if v := c.Get(ctx, InternalKey(l, "busy", "record")).Val(); !strings.Contains(v, ":"+last+":") {
			t.Fatalf("the name's record %q is not the last release's", v)
		}
		if ttl := c.PTTL(ctx, InternalKey(l, "busy", "record")).Val(); ttl < recordTTL-time.Second || ttl > 3*recordTTL {
			t.Fatalf("the name's record has TTL %v, want [%v, %v]", ttl, recordTTL-time.Second, 3*recordTTL)
		}
	})
}

// The name's record key keeps at least recordTTL after each write: a
// write onto a key that is about to expire renews it.
func TestRecordRenewsTheNameKey(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		r := recordRig{t: t, c: b.Client(t), b: b, name: "ttl"}
		r.take(tok('1'))
		r.release(tok('1'), stampOf(1, 1, 1))
		if err := r.c.PExpire(ctx, r.names("").nkey, time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		r.take(tok('2'))
		r.release(tok('2'), stampOf(1, 2, 2))
		if ttl := r.c.PTTL(ctx, r.names("").nkey).Val(); ttl < recordTTL {
			t.Fatalf("after a write onto a key with 1 s left its TTL is %v, want >= %v", ttl, recordTTL)
		}
	})
}

// A record key that holds something else (a stale format, another tool's
// value) is neither overwritten nor read as a record.
func TestRecordLeavesForeignValues(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		r := recordRig{t: t, c: b.Client(t), b: b, name: "f"}
		nkey := r.names("").nkey
		if err := r.c.Set(ctx, nkey, "junk", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		r.take(tok('1'))
		if got := r.release(tok('1'), stampOf(1, 1, 5)); got != 0 {
			t.Fatalf("release = %d", got)
		}
		if v := r.c.Get(ctx, nkey).Val(); v != "junk" {
			t.Fatalf("the name's record key holds %q, want the foreign value kept", v)
		}
		if got := r.release(tok('1'), stampOf(1, 1, 5)); got != 0 {
			t.Fatalf("the release run again = %d, want 0 from the token's record", got)
		}
	})
}

// releases: mark is the oldest release without a reply; a release whose
// reply never came holds the mark for recordTTL.
func TestReleasesMark(t *testing.T) {
	r := newReleases()
	mark := func(st stamp) any { return st.mark }
	s1, st1 := r.begin()
	s2, st2 := r.begin()
	if s1 != 1 || s2 != 2 || mark(st1) != mark(stampOf(0, 0, 1)) || mark(st2) != mark(stampOf(0, 0, 1)) {
		t.Fatalf("two releases in flight: %d %v, %d %v; want both marked 1", s1, st1, s2, st2)
	}
	if st1.owner != st2.owner || st1.seq != stampOf(0, 1, 0).seq {
		t.Fatalf("stamps %v, %v: want one owner, seq 1", st1, st2)
	}
	r.end(s1, true)
	if _, st := r.begin(); mark(st) != mark(stampOf(0, 0, 2)) {
		t.Fatalf("with release 2 in flight the mark is %v, want 2", mark(st))
	}
	r.end(s2, false) // no reply: protected
	r.end(3, true)
	if _, st := r.begin(); mark(st) != mark(stampOf(0, 0, 2)) {
		t.Fatalf("after release 2 failed the mark is %v, want 2", mark(st))
	}
	r.end(4, true)
	r.until = time.Now().Add(-time.Millisecond) // its record has expired
	if _, st := r.begin(); mark(st) != mark(stampOf(0, 0, 5)) {
		t.Fatalf("once release 2's record expired the mark is %v, want 5", mark(st))
	}
	if len(r.pending) != 1 {
		t.Fatalf("pending %v, want the one release in flight", r.pending)
	}
}

// args lists the stamp as release.lua takes it.
func (s stamp) args() []any {
	owner, seq, mark := s.releaseArgs()
	return []any{owner, seq, mark}
}

// unlock.lua writes record.lua's steps inline, and decides whether the
// name's record may be overwritten with a comparison of its own (old within
// [owner, owner..mark)): for the same release and whatever the name's key
// held before, both leave the same records at the same places.
func TestRecordUnlockMatchesRelease(t *testing.T) {
	own := func(o uint64) string { return stampOf(o, 0, 0).owner.(string) }
	num := func(v uint64) string { return stampOf(v, 0, 0).owner.(string) }
	const tail = ":x:r0>:0:0:f"
	// The release is owner 7's number 3, every earlier one answered (mark 3).
	cases := []struct {
		old       string // "" for none
		overwrite bool
	}{
		{"", true},
		{own(5) + num(1) + tail, false},                     // another Locker's, below
		{own(9) + num(1) + tail, false},                     // another Locker's, above
		{own(7) + num(2) + tail, true},                      // ours, answered
		{own(7) + num(3) + tail, false},                     // ours, numbered at the mark
		{own(7) + num(4) + tail, false},                     // ours, above the mark
		{own(7) + num(2), true},                             // ours, cut after its number
		{own(7) + num(3), false},                            // ours at the mark, cut after its number
		{own(7) + num(3)[:10], true},                        // ours, its number cut short (below the mark as text)
		{own(7)[:10], false},                                // a prefix of the owner
		{own(7), true},                                      // the owner alone
		{strings.ToUpper(own(0xab)) + num(1) + tail, false}, // not lower-case hex
		{"x", false},
	}
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		st := stampOf(7, 3, 3)
		for _, tc := range cases {
			short, long := recordRig{t: t, c: c, b: b, name: "s"}, recordRig{t: t, c: c, b: b, name: "l"}
			c.Del(ctx, short.names("").nkey, long.names("").nkey, short.names(tok('1')).tkey, long.names(tok('1')).tkey)
			if tc.old != "" {
				for _, r := range []recordRig{short, long} {
					c.Set(ctx, r.names("").nkey, tc.old, time.Minute)
				}
			}
			short.take(tok('1'))
			long.take(tok('1'))
			if got, err := unlockScript.Run(ctx, c, []string{short.names(tok('1')).key, short.names("").nkey, short.names(tok('1')).tkey}, st.unlockArgs(lockValue(tok('1'), false), tok('1'))...).Result(); err != nil || got != int64(0) {
				t.Fatalf("unlock.lua = %v, %v", got, err)
			}
			keys, args := scriptCall(nil, long.names(tok('1')), true, append([]any{tok('1'), "0", "", 0, 0}, st.args()...)...)
			if _, err := releaseScript.Run(ctx, c, keys, args...).Result(); err != nil {
				t.Fatal(err)
			}
			for _, k := range []func(n *names) string{func(n *names) string { return n.nkey }, func(n *names) string { return n.tkey }} {
				a, b := c.Get(ctx, k(short.names(tok('1')))).Val(), c.Get(ctx, k(long.names(tok('1')))).Val()
				if a != b {
					t.Fatalf("old %q: unlock.lua left %q, release.lua %q", tc.old, a, b)
				}
			}
			rec := own(7) + num(3) + ":" + tok('1') + recordTail
			if got := c.Get(ctx, short.names("").nkey).Val(); (got == rec) != tc.overwrite {
				t.Fatalf("old %q: the name's record is %q; overwritten: want %v", tc.old, got, tc.overwrite)
			}
		}
	})
}

// stampOf is the stamp of release seq of owner, made by hand.
func stampOf(owner, seq, mark uint64) stamp {
	var b [stampDigits]byte
	putHex(b[:], owner)
	return stamp{owner: string(b[:]), seq: seq, mark: mark}
}
