package reliability

import (
	"context"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// An abandoned attempt on a client that ignores deadlines is undone by a
// release once its late reply comes (mutex's undoLate). When that reply
// says the server went away and the server refuses connections, the
// release waits for the server, dialling on its own, instead of going
// through go-redis: each failed dial of go-redis counts toward its dial
// breaker (PoolSize of them opens it, and then every new connection is
// refused for up to a second after the server is back). The release of
// one abandoned attempt used to cost 3 to 4 of them (2 s of go-redis's
// dials and retries); go-redis's count is read after the release's bound.
// The late reply may also come before the kill (the attempt waited for a
// connection to the stopped server and timed out): the release then found
// the port accepting (the kernel accepts for a stopped server), went
// through go-redis, and after the kill spent 3 of its failed dials (4 of 10
// runs under two busy processes); it now waits for a PING's answer.
func TestOrphanReleaseSparesTheDialBreaker(t *testing.T) {
	srv := testutil.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr}) // go-redis's defaults
	t.Cleanup(func() { c.Close() })
	l, err := mutex.New(c, mutex.WithPrefix(testutil.NewPrefix()))
	if err != nil {
		t.Fatal(err)
	}
	warm, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lk, err := l.TryLock(warm, "warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(warm); err != nil {
		t.Fatal(err)
	}
	testutil.Freeze(t, srv.Pid())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := l.TryLock(ctx, "k"); err == nil {
		t.Fatal("TryLock on a stopped server succeeded")
	}
	srv.Kill() // the abandoned attempt's connection breaks; dials are refused
	before, _ := dialErrors(c)
	time.Sleep(3 * time.Second) // past the release's 2 s
	after, _ := dialErrors(c)
	t.Logf("go-redis failed dials: %d before the release, %d after", before, after)
	if after-before > 1 {
		t.Errorf("the abandoned attempt's undo cost go-redis %d failed dials; want at most 1 (its own call's)", after-before)
	}
}
