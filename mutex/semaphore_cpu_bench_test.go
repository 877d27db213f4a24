package mutex_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// answerSem answers a semaphore's scripts: an acquire (7 arguments) as
// granted, a release (4) as done.
func answerSem(cmd redis.Cmder) {
	c, ok := cmd.(*redis.Cmd)
	if !ok || !strings.EqualFold(cmd.Name(), "evalsha") {
		return
	}
	now := time.Now().UnixMilli()
	if len(cmd.Args())-3-3 == 4 {
		c.SetVal(int64(1))
	} else {
		c.SetVal([]any{int64(1), now, now + mutex.DefaultTTL.Milliseconds(), now})
	}
}

// BenchmarkSemClientCPU measures what an uncontended TryAcquire and its
// Release cost the client alone: against a client whose hook answers every
// script, with no server and no system call. "go-redis" is the same two
// EVALSHA calls sent straight through go-redis, the part no library can
// save.
// Rerun: go test -run '^$' -bench SemClientCPU -count 5 ./mutex
func BenchmarkSemClientCPU(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	c.AddHook(answerHook(answerSem))
	ctx := context.Background()

	b.Run("library", func(b *testing.B) {
		semCycles(b, ctx, mustSem(b, mustNew(b, c), "cpu", 4))
	})

	b.Run("go-redis", func(b *testing.B) {
		acquire, release := redis.NewScript("return 1"), redis.NewScript("return 0")
		keys := []string{"p{cpu}:sem", "p{cpu}:sem:ends", "p{cpu}:sem:queue"}
		b.ReportAllocs()
		for b.Loop() {
			tok := "0123456789abcdef0123456789abcdef"
			if err := acquire.EvalSha(ctx, c, keys, tok, 1, 4, 10000, "t", 150, "p{cpu}:sem:granted").Err(); err != nil {
				b.Fatal(err)
			}
			if err := release.EvalSha(ctx, c, keys, tok, "p{cpu}:sem:granted", 10000, "").Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// semCycles makes uncontended TryAcquire+Release cycles of s for b.
func semCycles(b *testing.B, ctx context.Context, s *mutex.Semaphore) {
	b.ReportAllocs()
	for b.Loop() {
		p, err := s.TryAcquire(ctx, 1)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
