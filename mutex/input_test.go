package mutex_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// TestNewRefusesBadArguments: New refuses a nil client and each bad option
// with an error matching ErrInvalid (ErrUnsupported for a client that an
// option cannot use), returns no Locker, and does not panic.
func TestNewRefusesBadArguments(t *testing.T) {
	b := testutil.Mini(t)
	c := b.Client(t)
	var nilClient *redis.Client
	cases := []struct {
		name   string
		client mutex.Client
		opts   []mutex.Option
		want   error
	}{
		{"nil client", nil, nil, mutex.ErrInvalid},
		{"typed nil client", nilClient, nil, mutex.ErrInvalid},
		{"nil client, good options", nil, []mutex.Option{mutex.WithTTL(time.Second)}, mutex.ErrInvalid},
		{"zero TTL", c, []mutex.Option{mutex.WithTTL(0)}, mutex.ErrInvalid},
		{"negative TTL", c, []mutex.Option{mutex.WithTTL(-time.Second)}, mutex.ErrInvalid},
		{"sub-millisecond TTL", c, []mutex.Option{mutex.WithTTL(time.Microsecond)}, mutex.ErrInvalid},
		{"zero retry", c, []mutex.Option{mutex.WithRetryInterval(0)}, mutex.ErrInvalid},
		{"negative retry", c, []mutex.Option{mutex.WithRetryInterval(-1)}, mutex.ErrInvalid},
		{"brace in prefix", c, []mutex.Option{mutex.WithPrefix("a{")}, mutex.ErrInvalid},
		{"long prefix", c, []mutex.Option{mutex.WithPrefix(strings.Repeat("p", 257))}, mutex.ErrInvalid},
		{"no replica", c, []mutex.Option{mutex.WithReplicaAck(0, time.Second)}, mutex.ErrInvalid},
		{"no replica bound", c, []mutex.Option{mutex.WithReplicaAck(1, 0)}, mutex.ErrInvalid},
		{"a bad option after good ones", c, []mutex.Option{mutex.WithTTL(time.Second), mutex.Option{}, mutex.WithPrefix("}")}, mutex.ErrInvalid},
		{"replica ack with a client that cannot WAIT", scripterOnly{c}, []mutex.Option{mutex.WithReplicaAck(1, time.Second)}, mutex.ErrUnsupported},
	}
	for _, tc := range cases {
		var l *mutex.Locker
		err := noPanic(func() (err error) { l, err = mutex.New(tc.client, tc.opts...); return err })
		if !errors.Is(err, tc.want) || l != nil {
			t.Errorf("%s: New = %v, %v; want nil, %v", tc.name, l, err, tc.want)
		}
	}
	if len(b.Mini.Keys()) != 0 {
		t.Errorf("refused options wrote keys: %v", b.Mini.Keys())
	}
}

// TestBadInput: a bad name, lease or Call is refused with ErrInvalid by
// every acquirer, before any command.
func TestBadInput(t *testing.T) {
	b := testutil.Mini(t)
	l := mustNew(t, b.Client(t))
	ctx := context.Background()
	cases := []struct {
		name string
		lock string
		opts []mutex.Option
	}{
		{"empty name", "", nil},
		{"name over 1 KiB", strings.Repeat("n", mutex.MaxNameLen+1), nil},
		{"name of 10 MiB", strings.Repeat("n", 10<<20), nil},
		{"zero lease", "x", []mutex.Option{mutex.WithTTL(0)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := l.TryLock(ctx, tc.lock, tc.opts...); !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("TryLock = %v, want ErrInvalid", err)
			}
			if _, err := l.Lock(ctx, tc.lock, tc.opts...); !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("Lock = %v, want ErrInvalid", err)
			}
			call := mutex.Call{Fragment: mutex.NewFragment("return 1")}
			if _, _, err := l.TryLockWith(ctx, tc.lock, call, tc.opts...); !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("TryLockWith = %v, want ErrInvalid", err)
			}
		})
	}
	if _, _, err := l.TryLockWith(ctx, "x", mutex.Call{}); !errors.Is(err, mutex.ErrInvalid) {
		t.Errorf("TryLockWith without a Fragment = %v, want ErrInvalid", err)
	}
	if len(b.Mini.Keys()) != 0 {
		t.Errorf("bad input wrote keys: %v", b.Mini.Keys())
	}
}

// Names are data: braces, globs, NUL, CR/LF and Lua-looking text lock their
// own name and nothing else, and every key stays under the prefix.
func TestOddNamesAreData(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		ctx := context.Background()
		l := newLocker(t, b)
		names := []string{"{", "}", "{}", "}{", "a{b}c", "*", "?", "[a-z]", "a\x00b", "a\r\nb",
			"'); redis.call('FLUSHALL') --", "~", "~1", strings.Repeat("x", mutex.MaxNameLen)}
		var held []*mutex.Lock
		for _, n := range names {
			lk, err := l.TryLock(ctx, n)
			if err != nil {
				t.Fatalf("TryLock(%q) = %v; a distinct name must be free", n, err)
			}
			held = append(held, lk)
		}
		for _, n := range names {
			if _, err := l.TryLock(ctx, n); !errors.Is(err, mutex.ErrLocked) {
				t.Fatalf("second TryLock(%q) = %v, want ErrLocked", n, err)
			}
		}
		keys, err := b.Client(t).Keys(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		mine := 0
		for _, k := range keys {
			if strings.HasPrefix(k, b.Prefix) {
				mine++
			}
		}
		if mine != len(names) {
			t.Fatalf("%d keys under the prefix for %d names", mine, len(names))
		}
		for _, lk := range held {
			if err := lk.Unlock(ctx); err != nil {
				t.Fatalf("Unlock(%q) = %v", lk.Name(), err)
			}
		}
	})
}

func TestNilLockIsSafe(t *testing.T) {
	var lk *mutex.Lock
	ctx := context.Background()
	if lk.Name() != "" || lk.Token() != "" || lk.Fence() != 0 {
		t.Error("nil Lock reports a name, token or fence")
	}
	if !closed(lk.Done()) {
		t.Error("Done of a nil Lock is open")
	}
	if c := lk.Context(ctx); c.Err() == nil || !errors.Is(context.Cause(c), mutex.ErrNotHeld) {
		t.Errorf("Context of a nil Lock: %v, %v", c.Err(), context.Cause(c))
	}
	if err := lk.Extend(ctx, time.Second); !errors.Is(err, mutex.ErrNotHeld) {
		t.Errorf("Extend = %v", err)
	}
	if _, err := lk.TTL(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Errorf("TTL = %v", err)
	}
	if _, err := lk.UnlockWith(ctx, mutex.Call{Fragment: writeFragment}); !errors.Is(err, mutex.ErrNotHeld) {
		t.Errorf("UnlockWith = %v", err)
	}
}

func TestKeySharesTheLockSlot(t *testing.T) {
	l := mustNew(t, testutil.Mini(t).Client(t), mutex.WithPrefix("p:"))
	if got, want := mustKey(t, l, "a{b}c", "state"), "p:{a~1b~2c}:state"; got != want {
		t.Fatalf("Key = %q, want %q", got, want)
	}
}
