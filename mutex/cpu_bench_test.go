package mutex_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// answerHook is a go-redis hook that answers every command in place of a
// server, by calling itself on it; it never dials.
type answerHook func(redis.Cmder)

func (answerHook) DialHook(redis.DialHook) redis.DialHook {
	return func(context.Context, string, string) (net.Conn, error) { return nil, net.ErrClosed }
}

func (h answerHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(_ context.Context, cmd redis.Cmder) error {
		h(cmd)
		return nil
	}
}

func (answerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// answerLock answers a free lock's commands: a SET NX as granted, an
// acquire script as granted, a release (unlock.lua: 3 keys, 4 arguments)
// as done.
func answerLock(cmd redis.Cmder) {
	switch c := cmd.(type) {
	case *redis.BoolCmd:
		c.SetVal(true)
	case *redis.Cmd:
		if strings.EqualFold(cmd.Name(), "evalsha") && len(cmd.Args()) == 3+3+4 {
			c.SetVal(int64(0))
		} else {
			c.SetVal([]any{int64(1), int64(mutex.DefaultTTL.Milliseconds()), int64(0)})
		}
	}
}

// BenchmarkClientCPU measures what an uncontended Lock and Unlock cost the
// client alone: against a client whose hook answers every command, with no
// server and no system call. "library" is the Locker; "go-redis" the same
// two commands (SET NX PX, the release's EVALSHA with as many keys and
// arguments) sent straight through go-redis, the part no library can save.
// The difference is the library's own CPU and allocations per cycle.
// Rerun: go test -run '^$' -bench ClientCPU -count 5 ./mutex
func BenchmarkClientCPU(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	c.AddHook(answerHook(answerLock))
	ns := benchLockNames(0)

	b.Run("library", func(b *testing.B) { serialCycles(b, context.Background(), mustNew(b, c), ns) })

	b.Run("go-redis", func(b *testing.B) {
		ctx := context.Background()
		release := redis.NewScript("return 0")
		var value any = mutex.FreeValue() // boxed once, as the Locker does
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			k := ns[i%benchNames]
			if err := c.SetNX(ctx, k, value, mutex.DefaultTTL).Err(); err != nil {
				b.Fatal(err)
			}
			if err := release.EvalSha(ctx, c, []string{k, k, k}, value, "owner", "record", "bound").Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
