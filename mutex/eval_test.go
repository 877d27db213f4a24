package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// Eval runs a script of the caller's with no lock: its reply, the script's
// error as it is, and bad input as ErrInvalid or ErrNilContext. Many
// goroutines' overlapping calls share round trips: 64 calls of an INCR
// script count 64, in fewer round trips than calls. A quorum Locker cannot
// (ErrUnsupported), as a nil one cannot (ErrInvalid).
func TestEval(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		rec := &testutil.CommandRecorder{}
		c.AddHook(rec)
		l, err := mutex.New(c, mutex.WithPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		incr := redis.NewScript(`return redis.call('INCR', KEYS[1])`)
		key := b.Prefix + "{n}:count"
		if n, err := l.Eval(ctx, incr, []string{key}); err != nil || n != int64(1) {
			t.Fatalf("Eval = %v, %v; want 1", n, err)
		}
		if _, err := l.Eval(ctx, redis.NewScript(`return redis.error_reply('ERR mine')`), nil); err == nil || err.Error() != "ERR mine" {
			t.Fatalf("a script's error: %v", err)
		}
		rec.Reset()
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				if _, err := l.Eval(ctx, incr, []string{key}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if n := c.Get(ctx, key).Val(); n != "65" {
			t.Fatalf("count %s after 64 more calls, want 65", n)
		}
		t.Logf("64 overlapping calls in %d round trips", rec.Trips())
		if rec.Trips() >= 64 {
			t.Errorf("64 overlapping calls took %d round trips; want them shared", rec.Trips())
		}
		//nolint:staticcheck // a nil context on purpose
		if _, err := l.Eval(nil, incr, []string{key}); !errors.Is(err, mutex.ErrNilContext) {
			t.Errorf("nil ctx: %v", err)
		}
		if _, err := l.Eval(ctx, nil, []string{key}); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("nil script: %v", err)
		}
		var nilLocker *mutex.Locker
		if _, err := nilLocker.Eval(ctx, incr, []string{key}); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("nil Locker: %v", err)
		}
	})
	q := newQuorum(t, newClients(t, testutil.StartServers(t, 3)))
	if _, err := q.Eval(context.Background(), redis.NewScript(`return 1`), nil); !errors.Is(err, mutex.ErrUnsupported) {
		t.Fatalf("a quorum's Eval: %v, want ErrUnsupported", err)
	}
}

func ExampleLocker_Eval() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	locker, _ := mutex.New(client)

	// Writes the balance only while nobody holds its lock: no lock taken.
	write := redis.NewScript(`if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1`)
	key := "fg:{balance:8}:value" // the lock's {hash tag}: one cluster slot
	written, err := locker.Eval(ctx, write, []string{key, locker.LockKey("balance:8")}, 100)
	fmt.Println(written, err, client.Get(ctx, key).Val())
	// Output:
	// 1 <nil> 100
}
