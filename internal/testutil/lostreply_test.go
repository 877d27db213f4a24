package testutil_test

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// The fault loses a reply after Redis ran the command, and go-redis (default
// options) sends the command again: a plain INCR then counts twice. That is
// the hazard the library's retry-safe scripts are tested against.
func TestLostReplyRetriedCommandRunsTwice(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, f := b.LostReplyClient(t, nil)
		key := b.Prefix + "n"
		if err := c.Set(ctx, key, 0, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		f.Drop(testutil.Named("incr"))
		n, err := c.Incr(ctx, key).Result()
		if err != nil {
			t.Fatalf("INCR with its reply lost: %v; want go-redis to retry it", err)
		}
		f.ExpectDropped(t, 1)
		if n != 2 {
			t.Fatalf("INCR retried after a lost reply = %d; want 2 (it ran twice)", n)
		}
		if got := f.Sent(testutil.Named("incr")); got != 2 {
			t.Fatalf("INCR sent %d times; want 2 (the lost one and the retry)", got)
		}
		if r := f.DroppedReplies()[0]; r.Reply != ":1\r\n" {
			t.Fatalf("dropped reply %q; want the first run's :1", r.Reply)
		}
	})
}

// A NOSCRIPT answer is not lost (the script did not run): the EVAL that
// go-redis's Script.Run sends next is.
func TestLostReplySkipsNoScript(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, f := b.LostReplyClient(t, nil)
		// A body of its own: no server has it cached.
		s := redis.NewScript("-- " + rand.Text() + "\nreturn redis.call('INCR', KEYS[1])")
		key := b.Prefix + "n"
		defer c.Del(ctx, key)
		f.Drop(testutil.ScriptHash(s.Hash()))
		n, err := s.Run(ctx, c, []string{key}).Int64()
		if err != nil {
			t.Fatal(err)
		}
		f.ExpectDropped(t, 1)
		if got := f.DroppedReplies()[0].Args[0]; got != "eval" {
			t.Fatalf("dropped the reply to %s; want eval's (evalsha's was NOSCRIPT)", got)
		}
		if n != 2 {
			t.Fatalf("script retried after a lost reply = %d; want 2", n)
		}
		if got := f.Sent(testutil.ScriptHash(s.Hash())); got != 3 {
			t.Fatalf("script sent %d times; want 3 (evalsha, eval, eval again)", got)
		}
	})
}

// DropNth answers the first n-1 matches; in a pipeline the fault waits for
// the reply of the matching command, not the first reply of the batch.
func TestLostReplyNthAndPipeline(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, f := b.LostReplyClient(t, nil)
		key, other := b.Prefix+"n", b.Prefix+"s"
		f.DropNth(2, testutil.Named("incr"))
		if n, err := c.Incr(ctx, key).Result(); err != nil || n != 1 {
			t.Fatalf("first INCR = %d, %v; want 1", n, err)
		}
		f.ExpectDropped(t, 0)
		var incr *redis.IntCmd
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, other, "v", time.Minute)
			incr = p.Incr(ctx, key)
			p.Get(ctx, other)
			return nil
		})
		if err != nil {
			t.Fatalf("pipeline with a lost reply: %v; want go-redis to retry it", err)
		}
		f.ExpectDropped(t, 1)
		if got := incr.Val(); got != 3 {
			t.Fatalf("INCR in a retried pipeline = %d; want 3 (ran twice)", got)
		}
		if got := f.DroppedReplies()[0].Reply; got != ":2\r\n" {
			t.Fatalf("dropped reply %q; want the INCR's :2", got)
		}
	})
}

// DropEvery loses the reply to every retry too, until Disarm: go-redis
// gives up with a network error.
func TestLostReplyEvery(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, f := b.LostReplyClient(t, nil)
		key := b.Prefix + "n"
		f.DropEvery(testutil.Named("incr"))
		err := c.Incr(ctx, key).Err()
		if err == nil || errors.Is(err, redis.Nil) {
			t.Fatalf("INCR with every reply lost: %v; want a network error", err)
		}
		sent := f.Sent(testutil.Named("incr"))
		if got := f.Dropped(); got != sent || got < 2 {
			t.Fatalf("dropped %d replies of %d INCRs; want all of them, and a retry", got, sent)
		}
		f.Disarm()
		if n, err := c.Incr(ctx, key).Result(); err != nil || n != int64(sent)+1 {
			t.Fatalf("INCR after Disarm = %d, %v; want %d", n, err, sent+1)
		}
	})
}
