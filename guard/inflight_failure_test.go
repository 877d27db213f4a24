package guard_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// replyError is an error reply of Redis, as go-redis returns one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// semFault is a go-redis hook that answers every command on a semaphore's
// keys with reply, and lets the others through: Redis that admits a call
// and then cannot give it a permit.
type semFault struct{ reply replyError }

func (h semFault) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h semFault) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if onSemaphore(cmd) {
			cmd.SetErr(h.reply)
			return h.reply
		}
		return next(ctx, cmd)
	}
}

func (h semFault) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var rest []redis.Cmder
		var err error
		for _, cmd := range cmds {
			if onSemaphore(cmd) {
				cmd.SetErr(h.reply)
				err = h.reply
			} else {
				rest = append(rest, cmd)
			}
		}
		if len(rest) > 0 {
			err = errors.Join(next(ctx, rest), err)
		}
		return err
	}
}

// onSemaphore reports whether cmd names a key of a semaphore.
func onSemaphore(cmd redis.Cmder) bool {
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.HasSuffix(s, "}:sem") {
			return true
		}
	}
	return false
}

// faultyGuard is a guard with p on a miniredis whose semaphore commands
// get reply.
func faultyGuard(t *testing.T, p []guard.Option, reply string) *guard.Guard {
	t.Helper()
	b := testutil.Mini(t)
	c := b.ClientOpts(t, &redis.Options{MaxRetries: -1})
	c.AddHook(semFault{replyError(reply)})
	g, err := guard.New(c, append(p, guard.WithPrefix(b.Prefix), guard.WithRules(plenty...), guard.WithInFlight(1))...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestInFlightRedisFailsClosed: an admitted call that Redis cannot give a
// permit does not run under FailClosed (ErrUnavailable, a degraded
// denial), nor, on a refusal, under FailOpen (ErrRejected).
func TestInFlightRedisFailsClosed(t *testing.T) {
	for name, c := range map[string]struct {
		p     []guard.Option
		reply string
		want  error
	}{
		"FailClosed, LOADING": {[]guard.Option{}, "LOADING Redis is loading the dataset in memory", guard.ErrUnavailable},
		"FailOpen, NOPERM":    {[]guard.Option{guard.WithOnError(guard.FailOpen)}, "NOPERM no permissions to run the 'evalsha' command", guard.ErrRejected},
	} {
		g := faultyGuard(t, c.p, c.reply)
		d, err := g.Do(context.Background(), "k", func(context.Context) error {
			t.Errorf("%s: fn ran without a permit", name)
			return nil
		})
		if !errors.Is(err, c.want) || errors.Is(err, guard.ErrBusy) || d.Allowed || !d.Degraded {
			t.Errorf("%s: Do = %+v, %v; want a degraded denial matching %v", name, d, err, c.want)
		}
	}
}

// TestInFlightFailOpenCountsInProcess: under FailOpen and with a Fallback,
// a call Redis cannot give a permit runs, reporting ErrUnavailable, on this
// process's count of the key's calls: InFlight 1, so a second call of the
// key while the first runs is refused with ErrBusy; another key runs.
func TestInFlightFailOpenCountsInProcess(t *testing.T) {
	for name, p := range map[string][]guard.Option{
		"FailOpen": {guard.WithOnError(guard.FailOpen)},
		"Fallback": {guard.WithFallback(guard.Fallback{Limit: 100, Burst: 100})},
	} {
		g := faultyGuard(t, p, "LOADING Redis is loading the dataset in memory")
		ctx := context.Background()
		var inner, other error
		d, err := g.Do(ctx, "k", func(context.Context) error {
			_, inner = g.Do(ctx, "k", func(context.Context) error {
				t.Errorf("%s: a second call of the key ran", name)
				return nil
			})
			_, other = g.Do(ctx, "other", func(context.Context) error { return nil })
			return nil
		})
		if !d.Allowed || !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("%s: first call = %+v, %v; want it run, with ErrUnavailable", name, d, err)
		}
		if !errors.Is(inner, guard.ErrBusy) || !errors.Is(other, guard.ErrUnavailable) || errors.Is(other, guard.ErrBusy) {
			t.Errorf("%s: second call of the key: %v (want ErrBusy); another key: %v (want it run)", name, inner, other)
		}
		if _, err := g.Do(ctx, "k", func(context.Context) error { return nil }); errors.Is(err, guard.ErrBusy) {
			t.Errorf("%s: after the first call ended: %v, want the place given back", name, err)
		}
	}
}
