package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// semKinds are the kinds of key a semaphore writes: the hash, the ends set
// (holders' and waiters' ends in server ms, records' ends plus 2^52) and
// the queue.
var semKinds = []string{"sem", "sem:ends", "sem:queue"}

// semRecordBase is what a record's score in the ends set adds to its end.
const semRecordBase = 1 << 52

// semSnapshot is one atomic read (MULTI) of a semaphore's keys.
type semSnapshot struct {
	now     int64            // server ms
	expires map[string]int64 // PEXPIRETIME: -2 no key, -1 no TTL
	last    map[string]int64 // the latest end a sorted set records (0: none)
	card    map[string]int64
	live    int64  // holders and waiters in the ends set
	records int64  // records in the ends set
	counts  string // the hash's scalars (field m), whose counts are held, w and d
}

func readSem(rc *redis.Client, s *mutex.Semaphore) (semSnapshot, error) {
	ctx := context.Background()
	snap := semSnapshot{expires: map[string]int64{}, last: map[string]int64{}, card: map[string]int64{}}
	var tm *redis.TimeCmd
	var hm *redis.StringCmd
	var live, records *redis.IntCmd
	var lastLive, lastRecord *redis.ZSliceCmd
	exp, last, card := map[string]*redis.DurationCmd{}, map[string]*redis.ZSliceCmd{}, map[string]*redis.IntCmd{}
	ends := mutex.SemKey(s, "sem:ends")
	_, err := rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		tm = p.Time(ctx)
		hm = p.HGet(ctx, mutex.SemKey(s, "sem"), "m")
		for _, k := range semKinds {
			key := mutex.SemKey(s, k)
			exp[k] = p.PExpireTime(ctx, key)
			if k != "sem" {
				last[k] = p.ZRangeWithScores(ctx, key, -1, -1)
				card[k] = p.ZCard(ctx, key)
			}
		}
		live = p.ZCount(ctx, ends, "-inf", semRecordScore)
		records = p.ZCount(ctx, ends, fmt.Sprint(semRecordBase), "+inf")
		lastLive = p.ZRevRangeByScoreWithScores(ctx, ends, &redis.ZRangeBy{Max: semRecordScore, Min: "-inf", Count: 1})
		lastRecord = p.ZRevRangeByScoreWithScores(ctx, ends, &redis.ZRangeBy{Max: "+inf", Min: fmt.Sprint(semRecordBase), Count: 1})
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) { // no hash: no scalars
		return snap, err
	}
	snap.now = tm.Val().UnixMilli()
	snap.counts = hm.Val()
	for k, c := range exp {
		snap.expires[k] = int64(c.Val() / time.Millisecond)
		if c.Val() < 0 {
			snap.expires[k] = int64(c.Val())
		}
	}
	for k, c := range last {
		if z := c.Val(); len(z) == 1 {
			snap.last[k] = int64(z[0].Score)
		}
		snap.card[k] = card[k].Val()
	}
	snap.live, snap.records = live.Val(), records.Val()
	delete(snap.last, "sem:ends") // its top score: a record's, 2^52 above its end
	if z := lastLive.Val(); len(z) == 1 {
		snap.last["sem:ends"] = int64(z[0].Score)
	}
	if z := lastRecord.Val(); len(z) == 1 {
		snap.last["sem:ends"] = max(snap.last["sem:ends"], int64(z[0].Score)-semRecordBase)
	}
	return snap, nil
}

// mustReadSem is readSem failing t on an error.
func mustReadSem(t *testing.T, rc *redis.Client, s *mutex.Semaphore) semSnapshot {
	t.Helper()
	snap, err := readSem(rc, s)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// check: no key without a TTL; no key expires before an end it records
// (the hash, which keeps the count, before any; the queue before the
// latest end of a holder or waiter); none lives longer than 5/4 of the
// longest duration used past now; the hash's counts match the sets.
func (snap semSnapshot) check(longest time.Duration) error {
	hash := snap.expires["sem"]
	for k, e := range snap.expires {
		switch {
		case e == -1:
			return fmt.Errorf("%s has no TTL", k)
		case e >= 0 && e-snap.now > longest.Milliseconds()*5/4:
			return fmt.Errorf("%s expires in %d ms, want at most 5/4 of %v", k, e-snap.now, longest)
		case e >= 0 && hash < e:
			return fmt.Errorf("the hash expires (%d) before %s (%d)", hash, k, e)
		}
	}
	for k, m := range snap.last {
		if m > snap.expires[k] || m > hash {
			return fmt.Errorf("%s records an end at %d, past its key's expiry %d or the hash's %d", k, m, snap.expires[k], hash)
		}
	}
	if snap.card["sem:queue"] > 0 && snap.expires["sem:queue"] < snap.last["sem:ends"] { // every key expires at exp
		return fmt.Errorf("the queue expires at %d, before the ends set's end %d", snap.expires["sem:queue"], snap.last["sem:ends"])
	}
	held, w, d := parseSemCounts(snap.counts)
	holders := snap.live - w
	if (held == 0) != (holders == 0) || holders < 0 || w != snap.card["sem:queue"] || d != snap.records {
		return fmt.Errorf("counts held %d w %d d %d, sets: %d holders and waiters, %d records, queue %d", held, w, d,
			snap.live, snap.records, snap.card["sem:queue"])
	}
	return nil
}

// TestSemaphoreKeysCoverEntries: under a mixed workload (holders that
// release, crash or extend; waiters that die, cancel or are granted;
// records of many lengths), every atomic snapshot of the keys shows every
// key with a TTL, none expiring before an end it records, none living
// more than 5/4 of the longest duration past now, and the hash's counts
// (held, w, d) matching the sets: the lazy touch and sweeps lose nothing.
func TestSemaphoreKeysCoverEntries(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	rc := b.Client(t)
	s := mustSem(t, newLocker(t, b, mutex.WithRetryInterval(10*time.Millisecond)), "cover", 3)
	const longest = 10 * time.Second // a cancelled wait's record (recordTTL); leases, wait leases and the other records are 2 s at most
	stop := make(chan struct{})
	var checks int
	var checkErr error
	var checker sync.WaitGroup
	checker.Add(1)
	go func() {
		defer checker.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			checks++
			snap, err := readSem(rc, s)
			if err == nil {
				err = snap.check(longest)
			}
			if err != nil && checkErr == nil {
				checkErr = err
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			// 3 s: past the leases and wait leases, so that sweeps run
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
				semWorkOnce(ctx, t, s, r)
			}
		}()
	}
	wg.Wait()
	close(stop)
	checker.Wait()
	if checkErr != nil {
		t.Fatal(checkErr)
	}
	if err := mustReadSem(t, rc, s).check(longest); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d snapshots checked", checks)
}

// semWorkOnce runs one random operation of the mixed workload.
func semWorkOnce(ctx context.Context, t *testing.T, s *mutex.Semaphore, r *rand.Rand) {
	lease := time.Duration(20+r.IntN(1900)) * time.Millisecond
	switch r.IntN(6) {
	case 0, 1: // a holder that releases, its record of a random length
		tok, ok, err := mutex.SemTake(ctx, s, 1+r.Int64N(2), lease)
		if err == nil && ok {
			_, err = mutex.SemReleaseFor(ctx, s, tok, time.Duration(1+r.IntN(1900))*time.Millisecond)
		}
		if err != nil {
			t.Error(err)
		}
	case 2: // a holder that crashes
		if _, _, err := mutex.SemTake(ctx, s, 1, lease); err != nil {
			t.Error(err)
		}
	case 3: // a waiter that dies
		if _, err := mutex.SemEnqueue(ctx, s, 1+r.Int64N(3)); err != nil {
			t.Error(err)
		}
	case 4: // a waiter that gives up (cancel) or is granted, then extends
		wctx, cancel := context.WithTimeout(ctx, time.Duration(r.IntN(30))*time.Millisecond)
		p, err := s.Acquire(wctx, 1, mutex.WithTTL(lease))
		cancel()
		if err == nil {
			_ = p.Extend(ctx, lease)
			_, _ = mutex.SemReleaseFor(ctx, s, p.Token(), lease) // a Permit's record is 10 s
		}
	default: // a TryAcquire that may be refused behind the queue
		if p, err := s.TryAcquire(ctx, 1, mutex.WithTTL(lease)); err == nil {
			_, _ = mutex.SemReleaseFor(ctx, s, p.Token(), lease)
		}
	}
}

// TestSemaphoreIdleKeysGone: a semaphore left with a released holder (its
// record), a crashed holder and a dead waiter, and no call after, has
// every key with a TTL, and all of them gone once the last of those ends
// (the crashed holder's 400 ms lease, plus a quarter of it) without any
// further call.
func TestSemaphoreIdleKeysGone(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	rc := b.Client(t)
	s := mustSem(t, newLocker(t, b, mutex.WithRetryInterval(10*time.Millisecond)), "idle", 3)
	tok, ok, err := mutex.SemTake(ctx, s, 1, 300*time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("take: %v %v", ok, err)
	}
	if _, err := mutex.SemReleaseFor(ctx, s, tok, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, ok, err = mutex.SemTake(ctx, s, 1, 400*time.Millisecond); err != nil || !ok { // crashes
		t.Fatalf("take: %v %v", ok, err)
	}
	if _, err := mutex.SemEnqueue(ctx, s, 3); err != nil { // queued behind it, dies
		t.Fatal(err)
	}
	snap := mustReadSem(t, rc, s)
	for _, k := range semKinds {
		if snap.expires[k] < 0 {
			t.Fatalf("%s: PEXPIRETIME %d, want a key with a TTL", k, snap.expires[k])
		}
	}
	if err := snap.check(time.Second); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		snap := mustReadSem(t, rc, s)
		if err := snap.check(time.Second); err != nil {
			t.Fatal(err)
		}
		left := 0
		for _, e := range snap.expires {
			if e != -2 {
				left++
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys left 20 s after the last end: %v", left, snap.expires)
		}
	}
}

// TestSemaphoreRecordsSwept: records of released tokens are swept by later
// calls once they end (a second at most after the last sweep), so the ends
// set does not grow under steady use. Twice: the second time after a sweep
// that left a record (then the next sweep is due a second later at most).
func TestSemaphoreRecordsSwept(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	rc := b.Client(t)
	s := mustSem(t, newLocker(t, b), "swept", 2)
	cycle := func(record time.Duration) {
		tok, ok, err := mutex.SemTake(ctx, s, 1, time.Minute)
		if err != nil || !ok {
			t.Fatalf("take: %v %v", ok, err)
		}
		if _, err := mutex.SemReleaseFor(ctx, s, tok, record); err != nil {
			t.Fatal(err)
		}
	}
	for round, want := range []int64{2, 1} {
		for range 40 {
			cycle(10 * time.Millisecond)
		}
		if round == 0 {
			cycle(2 * time.Second) // still recorded after the sweep below
		}
		time.Sleep(1500 * time.Millisecond) // past the short records' ends and the sweep gap (1 s)
		cycle(10 * time.Millisecond)
		if n := rc.ZCount(ctx, mutex.SemKey(s, "sem:ends"), fmt.Sprint(semRecordBase), "+inf").Val(); n != want {
			t.Fatalf("round %d: the ends set holds %d records after a call past the short ones' ends, want %d", round, n, want)
		}
	}
}

// TestSemaphoreCrashedHoldersTry: permits of holders that never release
// come back at their leases' ends (not at the keys' expiry) to TryAcquire
// alone (no waiter to wake a sweep): after one crashed holder is swept,
// the next one's end is still due.
func TestSemaphoreCrashedHoldersTry(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	s := mustSem(t, newLocker(t, b), "crashed", 2)
	// a record of 30 s keeps the keys: the permits must come back at the
	// leases' ends, not when the keys expire
	tok, ok, err := mutex.SemTake(ctx, s, 1, time.Second)
	if err != nil || !ok {
		t.Fatalf("take: %v %v", ok, err)
	}
	if _, err := mutex.SemReleaseFor(ctx, s, tok, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, lease := range []time.Duration{200 * time.Millisecond, 600 * time.Millisecond} {
		if _, ok, err := mutex.SemTake(ctx, s, 1, lease); err != nil || !ok {
			t.Fatalf("take: %v %v", ok, err)
		}
	}
	try := func(n int64) *mutex.Permit {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			p, err := s.TryAcquire(ctx, n, mutex.WithTTL(time.Minute))
			if err == nil {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("TryAcquire(%d) 10 s after the crashed holders' leases: %v", n, err)
			}
		}
	}
	if err := try(1).Release(ctx); err != nil { // the first crashed holder swept
		t.Fatal(err)
	}
	if err := try(2).Release(ctx); err != nil { // and the second
		t.Fatal(err)
	}
}

// TestSemaphoreFreshSetsGetTTL: a set created while the keys' expiry is
// already past its end (no key's expiry moves) gets that expiry: the queue
// of a first waiter; and every key stays covered while holders come and
// go and records are made (a record is a holder's new score in the ends
// set, which a release no longer empties).
func TestSemaphoreFreshSetsGetTTL(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	rc := b.Client(t)
	s := mustSem(t, newLocker(t, b, mutex.WithRetryInterval(10*time.Millisecond)), "fresh", 2)
	step := func(what string) {
		t.Helper()
		if err := mustReadSem(t, rc, s).check(2 * time.Second); err != nil {
			t.Fatalf("after %s: %v", what, err)
		}
	}
	take := func(lease time.Duration) string {
		t.Helper()
		tok, ok, err := mutex.SemTake(ctx, s, 1, lease)
		if err != nil || !ok {
			t.Fatalf("take: %v %v", ok, err)
		}
		return tok
	}
	release := func(tok string, record time.Duration) {
		t.Helper()
		if _, err := mutex.SemReleaseFor(ctx, s, tok, record); err != nil {
			t.Fatal(err)
		}
	}
	long := take(1900 * time.Millisecond) // the expiry: 2.4 s away
	short := take(100 * time.Millisecond)
	release(short, 100*time.Millisecond)
	step("the first record")
	release(long, 1900*time.Millisecond)
	step("the last holder's release")
	again := take(100 * time.Millisecond)
	step("a grant after the last holder left")
	take(100 * time.Millisecond)
	if _, err := mutex.SemEnqueue(ctx, s, 2); err != nil {
		t.Fatal(err)
	}
	step("a first waiter (queue created)")
	release(again, 100*time.Millisecond)
	step("a release")
}

// TestSemaphoreHeadPutBack: a release pops the head waiter to grant it;
// one that does not fit goes back at its place (strict FIFO), and the
// queue it re-creates (it was the only waiter) gets the keys' expiry; the
// waiter behind it, which would fit, still waits for it.
func TestSemaphoreHeadPutBack(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	rc := b.Client(t)
	// A wait lease of 30 s (3 retry intervals): the waiters, which never
	// poll, are not passed over during the test.
	s := mustSem(t, newLocker(t, b, mutex.WithRetryInterval(10*time.Second)), "putback", 3)
	queue := mutex.SemKey(s, "sem:queue")
	step := func(what string, want ...string) {
		t.Helper()
		if err := mustReadSem(t, rc, s).check(30 * time.Second); err != nil {
			t.Fatalf("after %s: %v", what, err)
		}
		if got := rc.ZRange(ctx, queue, 0, -1).Val(); !slices.Equal(got, want) {
			t.Fatalf("after %s: queue %v, want %v", what, got, want)
		}
	}
	take := func(n int64) string {
		t.Helper()
		tok, ok, err := mutex.SemTake(ctx, s, n, 20*time.Second)
		if err != nil || !ok {
			t.Fatalf("take %d: %v %v", n, ok, err)
		}
		return tok
	}
	enqueue := func(n int64) string {
		t.Helper()
		tok, err := mutex.SemEnqueue(ctx, s, n)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	release := func(tok string) {
		t.Helper()
		if res, err := mutex.SemReleaseFor(ctx, s, tok, time.Second); err != nil || res != 1 {
			t.Fatalf("release: %d, %v", res, err)
		}
	}
	two, one := take(2), take(1)
	big := enqueue(3)
	step("a waiter for 3 of 3 permits", big)
	release(one) // 1 free: big does not fit
	step("a release that frees too little for the head", big)
	small := enqueue(1)
	step("a second waiter, which would fit", big, small)
	release(two)
	step("the release that frees enough for the head", small)
	if f, err := rc.HGet(ctx, mutex.SemKey(s, "sem"), big).Result(); err != nil || !strings.HasPrefix(f, "h") {
		t.Fatalf("the head is not a holder after the release: %q, %v", f, err)
	}
	if _, ok, err := mutex.SemTake(ctx, s, 1, time.Second); err != nil || ok {
		t.Fatalf("a TryAcquire while the head holds every permit and a waiter queues: %v %v", ok, err)
	}
}
