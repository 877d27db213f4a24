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

func TestBadInput(t *testing.T) {
	b := testutil.Mini(t)
	c := b.Client(t)
	ctx := context.Background()
	var nilClient *redis.Client
	cases := []struct {
		name   string
		locker *mutex.Locker
		lock   string
		opts   []mutex.LockOption
		want   error
	}{
		{"nil client", mutex.New(nil), "x", nil, mutex.ErrNilClient},
		{"typed nil client", mutex.New(nilClient), "x", nil, mutex.ErrNilClient},
		{"zero TTL", mutex.New(c, mutex.WithTTL(0)), "x", nil, mutex.ErrInvalidTTL},
		{"negative TTL", mutex.New(c, mutex.WithTTL(-time.Second)), "x", nil, mutex.ErrInvalidTTL},
		{"sub-millisecond TTL", mutex.New(c, mutex.WithTTL(time.Microsecond)), "x", nil, mutex.ErrInvalidTTL},
		{"zero retry", mutex.New(c, mutex.WithRetryInterval(0)), "x", nil, mutex.ErrInvalidRetry},
		{"negative retry", mutex.New(c, mutex.WithRetryInterval(-1)), "x", nil, mutex.ErrInvalidRetry},
		{"brace in prefix", mutex.New(c, mutex.WithPrefix("a{")), "x", nil, mutex.ErrInvalidPrefix},
		{"long prefix", mutex.New(c, mutex.WithPrefix(strings.Repeat("p", 257))), "x", nil, mutex.ErrInvalidPrefix},
		{"empty name", mutex.New(c), "", nil, mutex.ErrInvalidName},
		{"name over 1 KiB", mutex.New(c), strings.Repeat("n", mutex.MaxNameLen+1), nil, mutex.ErrInvalidName},
		{"name of 10 MiB", mutex.New(c), strings.Repeat("n", 10<<20), nil, mutex.ErrInvalidName},
		{"zero lease", mutex.New(c), "x", []mutex.LockOption{mutex.Lease(0)}, mutex.ErrInvalidTTL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.locker.TryLock(ctx, tc.lock, tc.opts...); !errors.Is(err, tc.want) {
				t.Errorf("TryLock = %v, want %v", err, tc.want)
			}
			if _, err := tc.locker.Lock(ctx, tc.lock, tc.opts...); !errors.Is(err, tc.want) {
				t.Errorf("Lock = %v, want %v", err, tc.want)
			}
			call := mutex.Call{Fragment: mutex.NewFragment("return 1")}
			if _, _, err := tc.locker.TryLockWith(ctx, tc.lock, call, tc.opts...); !errors.Is(err, tc.want) {
				t.Errorf("TryLockWith = %v, want %v", err, tc.want)
			}
		})
	}
	if _, _, err := mutex.New(c).TryLockWith(ctx, "x", mutex.Call{}); !errors.Is(err, mutex.ErrInvalidCall) {
		t.Errorf("TryLockWith without a Fragment = %v, want ErrInvalidCall", err)
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
	l := mutex.New(testutil.Mini(t).Client(t), mutex.WithPrefix("p:"))
	if got, want := l.Key("a{b}c", "state"), "p:{a~1b~2c}:state"; got != want {
		t.Fatalf("Key = %q, want %q", got, want)
	}
}
