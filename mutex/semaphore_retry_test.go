package mutex_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// semHeld returns the permits Redis counts as held, and the holders: the
// members of the ends set scored below a record's (2^52), less the waiters.
func semHeld(t *testing.T, rc *redis.Client, s *mutex.Semaphore) (int64, int64) {
	t.Helper()
	ctx := context.Background()
	held, _, _ := semCounts(rc, s)
	live := rc.ZCount(ctx, mutex.SemKey(s, "sem:ends"), "-inf", semRecordScore).Val()
	return held, live - rc.ZCard(ctx, mutex.SemKey(s, "sem:queue")).Val()
}

// semCounts returns the counts a semaphore's hash keeps in its scalars
// ("[<held>,<w>,<d>,...]" in field m): the permits held, the waiters and the
// records (0 when there is no hash).
func semCounts(rc *redis.Client, s *mutex.Semaphore) (held, w, d int64) {
	return parseSemCounts(rc.HGet(context.Background(), mutex.SemKey(s, "sem"), "m").Val())
}

// parseSemCounts reads the counts of field m's value.
func parseSemCounts(m string) (held, w, d int64) {
	var f []int64
	if json.Unmarshal([]byte(m), &f) != nil || len(f) < 3 {
		return 0, 0, 0
	}
	return f[0], f[1], f[2]
}

// semHolds reports whether tok holds permits of s in Redis, and the end of
// their lease (its field in the hash is a holder's: "h<n>:<fence>:<end>").
func semHolds(t *testing.T, rc *redis.Client, s *mutex.Semaphore, tok string) (int64, bool) {
	t.Helper()
	f, err := rc.HGet(context.Background(), mutex.SemKey(s, "sem"), tok).Result()
	if err != nil || !strings.HasPrefix(f, "h") {
		return 0, false
	}
	end, _ := strconv.ParseInt(f[strings.LastIndexByte(f, ':')+1:], 10, 64)
	return end, true
}

// semRecordScore bounds the scores of holders and waiters in the ends set
// (ZCOUNT's max, exclusive): a record scores 2^52 plus its end.
const semRecordScore = "(4503599627370496"

// TestSemaphoreLostReplies: the reply of an acquire, then of a release, is
// lost after Redis ran it; go-redis (default options) runs the script again,
// and the second run answers as the first: the acquisition is counted once,
// and the release returns nil.
func TestSemaphoreLostReplies(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	f := testutil.NewLostReply(t)
	c := b.ClientOpts(t, f.Options(""))
	l := mustNew(t, c, mutex.WithPrefix(b.Prefix))
	s := mustSem(t, l, "retry", 5)
	rc := b.Client(t)
	sems := testutil.Scripts(mutex.SemKey(s, "sem:ends"))

	f.Drop(sems)
	p, err := s.TryAcquire(ctx, 3)
	if err != nil {
		t.Fatalf("TryAcquire whose reply was lost: %v", err)
	}
	f.ExpectDropped(t, 1)
	if held, holders := semHeld(t, rc, s); held != 3 || holders != 1 {
		t.Fatalf("after a retried TryAcquire(3): %d permits held by %d holders, want 3 by 1", held, holders)
	}

	// A waiter's poll whose reply was lost: queued once, granted once.
	q, err := s.TryAcquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		wp, err := s.Acquire(ctx, 4)
		if err == nil {
			err = wp.Release(ctx)
		}
		got <- err
	}()
	waitSemQueued(t, b, s, 1)

	f.Drop(sems)
	if err := p.Release(ctx); err != nil {
		t.Fatalf("Release whose reply was lost: %v", err)
	}
	f.ExpectDropped(t, 2)
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	if held, holders := semHeld(t, rc, s); held != 0 || holders != 0 {
		t.Fatalf("after every release: %d permits held by %d holders, want none", held, holders)
	}
}

// semDynNames is how many names TestSemaphoreKeysExpire takes (the issue's
// 100,000); every semDynAbandon-th is left with a waiter that died and a
// holder that crashed.
const (
	semDynNames   = 100_000
	semDynAbandon = 100
)

// TestSemaphoreKeysExpire: 100,000 dynamic names (10,000 with -short), each taken and released
// by 32 goroutines sharing one Locker (its calls go in pipelines), 1 in 100
// left with a dead waiter and a crashed holder, leave no key without a
// TTL: a released name keeps only its counters and its release record,
// and every name's keys go by the end of the longest lease (1 minute) or
// record it kept, and a quarter of that (semaphore.lua moves the expiry
// past an end with that much to spare, and does not bring it back when a
// holder releases early, so that most calls need not move it).
func TestSemaphoreKeysExpire(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	l := newLocker(t, b)
	names := semDynNames
	if testing.Short() {
		names /= 10
	}
	next := make(chan int, 1024)
	go func() {
		defer close(next)
		for i := range names {
			next <- i
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for i := range next {
				if err := semDynName(ctx, l, i); err != nil {
					errs <- err
					for range next { // let the feeder finish
					}
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	released, abandoned := semScanKeys(t, b.Client(t), b.Prefix)
	if released == 0 || abandoned == 0 {
		t.Fatalf("%d keys of released names, %d of abandoned ones: the test checks nothing", released, abandoned)
	}
	t.Logf("%d names: %d keys of released names, %d of abandoned ones, each with a TTL", names, released, abandoned)
}

// semDynName takes the 2 permits of name dyn:<i> and releases them, or
// (1 in semDynAbandon) abandons them and queues a waiter that never polls.
func semDynName(ctx context.Context, l *mutex.Locker, i int) error {
	s, err := l.Semaphore(fmt.Sprint("dyn:", i), 2)
	if err != nil {
		return err
	}
	p, err := s.TryAcquire(ctx, 2, mutex.WithTTL(time.Minute))
	if err != nil {
		return fmt.Errorf("name %d: %w", i, err)
	}
	if i%semDynAbandon == 0 {
		_, err = mutex.SemEnqueue(ctx, s, 1)
		return err
	}
	return p.Release(ctx)
}

// semScanKeys checks the TTL of every key under prefix, SCAN by SCAN with
// the PTTLs of a batch in one pipeline, and counts the keys of released
// and of abandoned names.
func semScanKeys(t *testing.T, rc *redis.Client, prefix string) (released, abandoned int) {
	ctx := context.Background()
	for cursor := uint64(0); ; {
		keys, next, err := rc.Scan(ctx, cursor, prefix+"*", 2000).Result()
		if err != nil {
			t.Fatal(err)
		}
		pipe := rc.Pipeline()
		ttls := make([]*redis.DurationCmd, len(keys))
		for k, key := range keys {
			ttls[k] = pipe.PTTL(ctx, key)
		}
		if _, err := pipe.Exec(ctx); err != nil && len(keys) > 0 {
			t.Fatal(err)
		}
		for k, key := range keys {
			ttl := ttls[k].Val()
			if ttl == -2*time.Nanosecond { // expired since the scan saw it
				continue
			}
			if semDynAbandoned(t, prefix, key) {
				abandoned++
				if ttl < 0 || ttl > time.Minute*5/4 { // -1 ns: no TTL; 0: expiring now
					t.Fatalf("key %s of an abandoned name has TTL %v, want [0, 1m15s]", key, ttl)
				}
				continue
			}
			released++
			kind := key[strings.LastIndex(key, "}:")+2:]
			if kind != "sem" && kind != "sem:ends" || ttl < 0 || ttl > time.Minute*5/4 {
				t.Fatalf("key %s of a released name has TTL %v: want only the counters and the release record, for [0, 1m15s]", key, ttl)
			}
		}
		if cursor = next; cursor == 0 {
			return released, abandoned
		}
	}
}

// semDynAbandoned reports whether key belongs to an abandoned name.
func semDynAbandoned(t *testing.T, prefix, key string) bool {
	name := strings.TrimPrefix(key, prefix+"{dyn:")
	i, err := strconv.Atoi(name[:strings.IndexByte(name, '}')])
	if err != nil {
		t.Fatalf("key %s: not a key of the test", key)
	}
	return i%semDynAbandon == 0
}

// TestSemaphoreRoundTrips counts commands: an uncontended TryAcquire and
// Release take one round trip each; a contended hand-off is the release's
// one round trip, and the waiter wakes holding its permits with no command
// of its own.
func TestSemaphoreRoundTrips(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	var hold, wait testutil.CommandRecorder
	hc, wc := b.Client(t), b.Client(t)
	hc.AddHook(&hold)
	wc.AddHook(&wait)
	slow := mutex.WithRetryInterval(10 * time.Second) // the waiter polls every 2.5 to 12.5 s (a quarter of its 10 s lease, plus up to a retry interval)
	hs := mustSem(t, mustNew(t, hc, mutex.WithPrefix(b.Prefix), slow), "trips", 2)
	ws := mustSem(t, mustNew(t, wc, mutex.WithPrefix(b.Prefix), slow), "trips", 2)
	wait.Reset()
	for range 3 {
		p, err := hs.TryAcquire(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Release(ctx)
	}
	hold.Reset()
	p, err := hs.TryAcquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := hold.Trips(); n != 2 {
		t.Errorf("uncontended TryAcquire + Release: %d round trips %v, want 2", n, hold.Shapes())
	}

	p, err = hs.TryAcquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *mutex.Permit, 1)
	go func() {
		wp, err := ws.Acquire(ctx, 1)
		if err != nil {
			t.Error(err)
		}
		got <- wp
	}()
	waitSemQueued(t, b, ws, 1)
	// Its first poll queued it, it subscribed, and polled once more (a grant
	// before the subscription would go unheard): then it waits.
	for deadline := time.Now().Add(10 * time.Second); semScripts(wait.Commands()) < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the waiter made %d polls, want 2", semScripts(wait.Commands()))
		}
	}
	hold.Reset()
	wait.Reset()
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wp := <-got
	if n := hold.Trips(); n != 1 {
		t.Errorf("the hand-off's release: %d round trips, want 1", n)
	}
	if cmds := wait.Commands(); len(cmds) != 0 {
		t.Errorf("the woken waiter sent %d commands %v, want none", len(cmds), wait.Shapes())
	}
	if wp == nil || wp.N() != 1 {
		t.Fatalf("the waiter got %v", wp)
	}
	_ = wp.Release(ctx)
}

// TestSemaphoreListeningWaiterPollsOnce: a waiter whose Locker already
// listens to the semaphore's grants (another of its waiters subscribed)
// listens before its first poll, so that one poll queues it and the
// release's message grants it: a contended hand-off is one release round
// trip and one Pub/Sub message, with no second poll per waiter.
func TestSemaphoreListeningWaiterPollsOnce(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	var wait testutil.CommandRecorder
	wc := b.Client(t)
	wc.AddHook(&wait)
	slow := mutex.WithRetryInterval(10 * time.Second) // waiters poll every 2.5 to 12.5 s
	hs := mustSem(t, mustNew(t, b.Client(t), mutex.WithPrefix(b.Prefix), slow), "once", 2)
	ws := mustSem(t, mustNew(t, wc, mutex.WithPrefix(b.Prefix), slow), "once", 2)
	p, err := hs.TryAcquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *mutex.Permit, 2)
	acquire := func() {
		wp, err := ws.Acquire(ctx, 1)
		if err != nil {
			t.Error(err)
		}
		got <- wp
	}
	go acquire()
	waitSemQueued(t, b, ws, 1)
	for deadline := time.Now().Add(10 * time.Second); semScripts(wait.Commands()) < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the first waiter made %d polls, want 2 (queue, subscribe, poll again)", semScripts(wait.Commands()))
		}
	}
	wait.Reset()
	go acquire()
	waitSemQueued(t, b, ws, 2)
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if wp := <-got; wp != nil {
			_ = wp.Release(ctx)
		}
	}
	if n := semScripts(wait.Commands()); n != 1+2 { // its one poll; the two Releases
		t.Errorf("the second waiter and the releases sent %d scripts %v, want 3: one poll, two releases", n, wait.Shapes())
	}
}

// semScripts counts the script calls among cmds.
func semScripts(cmds []testutil.Command) int {
	n := 0
	for _, c := range cmds {
		if c.Script != "" {
			n++
		}
	}
	return n
}
