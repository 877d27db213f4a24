package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// Bad input beyond input_test.go: every entry point, the boundaries of the
// name length, names that look like keys, Lua or globs, extreme durations,
// nil clients of every kind and ended contexts. Each case must give the
// documented error (matched with errors.Is) or behaviour, never panic, and
// leave no key outside the test's prefix or without a TTL.

// noPanic runs f and turns a panic into an error.
func noPanic(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return f()
}

var (
	badRead  = mutex.NewFragment(`return redis.call('GET', KEYS[1])`)
	badWrite = mutex.NewFragment(`redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000) return ARGV[1]`)
)

// acquirers are the four ways to take a lock, as one signature.
var acquirers = []struct {
	name string
	call func(ctx context.Context, l *mutex.Locker, name string, opts ...mutex.Option) (*mutex.Lock, error)
}{
	{"TryLock", func(ctx context.Context, l *mutex.Locker, name string, opts ...mutex.Option) (*mutex.Lock, error) {
		return l.TryLock(ctx, name, opts...)
	}},
	{"Lock", func(ctx context.Context, l *mutex.Locker, name string, opts ...mutex.Option) (*mutex.Lock, error) {
		return l.Lock(ctx, name, opts...)
	}},
	{"TryLockWith", func(ctx context.Context, l *mutex.Locker, name string, opts ...mutex.Option) (*mutex.Lock, error) {
		lk, _, err := l.TryLockWith(ctx, name, mutex.Call{Fragment: badRead, Keys: []string{mutex.InternalKey(l, "x", "data")}}, opts...)
		return lk, err
	}},
	{"LockWith", func(ctx context.Context, l *mutex.Locker, name string, opts ...mutex.Option) (*mutex.Lock, error) {
		lk, _, err := l.LockWith(ctx, name, mutex.Call{Fragment: badRead, Keys: []string{mutex.InternalKey(l, "x", "data")}}, opts...)
		return lk, err
	}},
}

// TestBadInputNameLength: names of 0, MaxNameLen+1, 1 MiB and 10 MiB bytes
// are refused by every acquirer with ErrInvalid before any command is
// sent; a name of exactly MaxNameLen (1 KiB) bytes is a name like any other.
func TestBadInputNameLength(t *testing.T) {
	for _, s := range testutil.Stores(t) {
		ctx := context.Background()
		l := mustNew(t, s.Client, mutex.WithPrefix(s.Prefix))
		for _, n := range []int{0, mutex.MaxNameLen + 1, 1 << 20, 10 << 20} {
			name := strings.Repeat("n", n)
			before := s.Cmds.N.Load()
			for _, a := range acquirers {
				lk, err := a.call(ctx, l, name)
				if !errors.Is(err, mutex.ErrInvalid) || lk != nil {
					t.Errorf("%s: %s of a %d-byte name = %v, %v; want ErrInvalid", s.Name, a.name, n, lk, err)
				}
			}
			if sent := s.Cmds.N.Load() - before; sent != 0 {
				t.Errorf("%s: a %d-byte name sent %d commands; want it refused before Redis", s.Name, n, sent)
			}
		}
		name := strings.Repeat("n", mutex.MaxNameLen)
		for _, a := range acquirers {
			lk, err := a.call(ctx, l, name)
			if err != nil {
				t.Fatalf("%s: %s of a name of MaxNameLen bytes = %v", s.Name, a.name, err)
			}
			if n, _ := s.Client.Exists(ctx, l.LockKey(name)).Result(); n != 1 {
				t.Errorf("%s: %s: the lock is not at Key(name, \"lock\")", s.Name, a.name)
			}
			s.CheckKeys(t, a.name+" of a 1 KiB name")
			if err := lk.Unlock(ctx); err != nil {
				t.Fatalf("%s: Unlock = %v", s.Name, err)
			}
		}
	}
}

// oddNames are names that look like keys, braces, globs, protocol or Lua.
// "a:lock" reads like the lock key of "a", ":lock" like a kind; none may
// collide with another name.
var oddNames = []string{
	"a", "a:lock", "a:fence", "a:released", ":lock", "lock", ":", "a:", "{a}:lock", "a}:lock",
	"{", "}", "{}", "}{", "a{b}c", "{a}{b}", "~", "~0", "~1", "~2", "~{",
	"\x00", "a\x00b", "\r\n", "a\r\nb", "*3\r\n$3\r\nDEL\r\n",
	"*", "?", "[", "]", "*?[]", "[a-z]*", "\\*",
	"') redis.call('FLUSHALL') --", "]]..redis.call('DEL', KEYS[1])..[[", "%s%d%v", "\xff\xfe",
	strings.Repeat("{", mutex.MaxNameLen), strings.Repeat("}", mutex.MaxNameLen),
}

// TestBadInputOddNamesEveryEntryPoint takes odd names through LockWith,
// TryLockWith, Run, Extend, TTL and UnlockWith at once (so two names that
// shared a key would collide), writes each name as the value of its own
// state key (a payload passed as an argument, never as Lua source), and
// reads the values back.
func TestBadInputOddNamesEveryEntryPoint(t *testing.T) {
	for _, s := range testutil.Stores(t) {
		ctx := context.Background()
		l := mustNew(t, s.Client, mutex.WithPrefix(s.Prefix), mutex.WithTTL(time.Minute), mutex.WithFencing())
		other := mustNew(t, s.Client, mutex.WithPrefix(s.Prefix))
		held := make([]*mutex.Lock, len(oddNames))
		for i, name := range oddNames {
			state := mutex.Call{Fragment: badRead, Keys: []string{mustKey(t, l, name, "state")}}
			var lk *mutex.Lock
			var res any
			var err error
			if i%2 == 0 {
				lk, res, err = l.LockWith(ctx, name, state)
			} else {
				lk, res, err = l.TryLockWith(ctx, name, state)
			}
			if err != nil || res != nil {
				t.Fatalf("%s: taking %.40q = %v, %v; want the lock and no state: a name of its own", s.Name, name, res, err)
			}
			held[i] = lk
		}
		s.CheckKeys(t, "taking the odd names")
		for i, name := range oddNames {
			lk := held[i]
			if _, _, err := other.TryLockWith(ctx, name, mutex.Call{Fragment: badRead, Keys: []string{mustKey(t, l, name, "state")}}); !errors.Is(err, mutex.ErrLocked) {
				t.Errorf("%s: a second TryLockWith(%.40q) = %v, want ErrLocked", s.Name, name, err)
			}
			if n, _ := s.Client.Exists(ctx, l.LockKey(name)).Result(); n != 1 {
				t.Errorf("%s: no lock at Key(%.40q, \"lock\")", s.Name, name)
			}
			if res, err := lk.Run(ctx, mutex.Call{Fragment: badWrite, Keys: []string{mustKey(t, l, name, "state")}, Args: []any{"run:" + name}}); err != nil || res != "run:"+name {
				t.Errorf("%s: Run(%.40q) = %.60v, %v", s.Name, name, res, err)
			}
			if err := lk.Extend(ctx, 2*time.Minute); err != nil {
				t.Errorf("%s: Extend(%.40q) = %v", s.Name, name, err)
			}
			if ttl, err := lk.TTL(ctx); err != nil || ttl <= time.Minute {
				t.Errorf("%s: TTL(%.40q) after Extend(2m) = %v, %v", s.Name, name, ttl, err)
			}
			if lk.Fence() <= 0 {
				t.Errorf("%s: Fence(%.40q) = %d", s.Name, name, lk.Fence())
			}
		}
		for i, name := range oddNames {
			if res, err := held[i].UnlockWith(ctx, mutex.Call{Fragment: badWrite, Keys: []string{mustKey(t, l, name, "state")}, Args: []any{name}}); err != nil || res != name {
				t.Errorf("%s: UnlockWith(%.40q) = %.60v, %v", s.Name, name, res, err)
			}
		}
		for _, name := range oddNames {
			if got, err := s.Client.Get(ctx, mustKey(t, l, name, "state")).Result(); err != nil || got != name {
				t.Errorf("%s: the state of %.40q holds %.60q, %v; want the name itself", s.Name, name, got, err)
			}
			if n, _ := s.Client.Exists(ctx, l.LockKey(name)).Result(); n != 0 {
				t.Errorf("%s: the lock of %.40q survived UnlockWith", s.Name, name)
			}
		}
		for i, name := range oddNames {
			rec, _ := s.Client.Get(ctx, mutex.InternalKey(l, name, "record")).Result()
			if !strings.Contains(rec, ":"+held[i].Token()+":") {
				t.Errorf("%s: no release record for %.40q (the name's record holds %q)", s.Name, name, rec)
			}
		}
		if n, err := s.Client.DBSize(ctx).Result(); err != nil || n != int64(3*len(oddNames)) {
			t.Errorf("%s: %d keys (%v) for %d names; want a state, a fencing counter and a release record each", s.Name, n, err, len(oddNames))
		}
		s.CheckKeys(t, "releasing the odd names")
	}
}

// TestBadInputKeyKindsDoNotCollide: the key scheme behind Key never gives one
// (name, kind) the key of another, whatever ':' and braces they hold, for
// the Locker's own kinds too (which Key itself refuses).
func TestBadInputKeyKindsDoNotCollide(t *testing.T) {
	l := mustNew(t, testutil.Mini(t).Client(t), mutex.WithPrefix("p:"))
	kinds := []string{"lock", "fence", "released", "state", "", ":", "lock:", "}", "{", "{x}", "a:lock"}
	seen := map[string]string{}
	for _, name := range append([]string{"", "x"}, oddNames...) {
		for _, kind := range kinds {
			k := mutex.InternalKey(l, name, kind)
			if !strings.HasPrefix(k, "p:{") {
				t.Fatalf("Key(%.40q, %q) = %.80q leaves the prefix", name, kind, k)
			}
			id := fmt.Sprintf("(%.40q, %q)", name, kind)
			if prev, ok := seen[k]; ok {
				t.Fatalf("Key%s = Key%s = %.80q", id, prev, k)
			}
			seen[k] = id
		}
	}
}

// TestBadInputDurations: leases and retry intervals below a millisecond,
// negative, the most negative Duration, or over MaxTTL (100 years,
// math.MaxInt64) are refused; the longest accepted (MaxTTL) gives the lock
// key that TTL; an Extend that is refused leaves the lease as it was.
func TestBadInputDurations(t *testing.T) {
	for _, s := range testutil.Stores(t) {
		ctx := context.Background()
		opt := mutex.WithPrefix(s.Prefix)
		for desc, o := range map[string]mutex.Option{
			"WithTTL(999µs)":              mutex.WithTTL(999 * time.Microsecond),
			"WithTTL(MinInt64)":           mutex.WithTTL(math.MinInt64),
			"WithRetryInterval(999µs)":    mutex.WithRetryInterval(999 * time.Microsecond),
			"WithRetryInterval(MinInt64)": mutex.WithRetryInterval(math.MinInt64),
			"WithTTL(100 years)":          mutex.WithTTL(100 * 365 * 24 * time.Hour),
			"WithTTL(MaxInt64)":           mutex.WithTTL(math.MaxInt64),
			"WithRetryInterval(MaxInt64)": mutex.WithRetryInterval(math.MaxInt64),
			"WithTTL(MaxTTL+1ms)":         mutex.WithTTL(mutex.MaxTTL + time.Millisecond),
		} {
			if l, err := mutex.New(s.Client, opt, o); !errors.Is(err, mutex.ErrInvalid) || l != nil {
				t.Errorf("%s: New with %s = %v, %v; want nil, ErrInvalid", s.Name, desc, l, err)
			}
		}
		plain := mustNew(t, s.Client, opt)
		refused := []struct {
			desc string
			opts []mutex.Option
		}{
			{"WithTTL(-1ns)", []mutex.Option{mutex.WithTTL(-1)}},
			{"WithTTL(999µs)", []mutex.Option{mutex.WithTTL(999 * time.Microsecond)}},
			{"WithTTL(MinInt64)", []mutex.Option{mutex.WithTTL(math.MinInt64), mutex.WithAutoRenew()}},
			{"a valid Lease after a bad one", []mutex.Option{mutex.WithTTL(0), mutex.WithTTL(time.Second)}},
			{"WithTTL(MaxInt64)", []mutex.Option{mutex.WithTTL(math.MaxInt64)}},
			{"WithTTL(MaxInt64), WithAutoRenew", []mutex.Option{mutex.WithTTL(math.MaxInt64), mutex.WithAutoRenew()}},
			{"WithTTL(MaxTTL+1ms)", []mutex.Option{mutex.WithTTL(mutex.MaxTTL + time.Millisecond)}},
		}
		for _, tc := range refused {
			for _, a := range acquirers {
				var lk *mutex.Lock
				err := noPanic(func() (err error) { lk, err = a.call(ctx, plain, "d", tc.opts...); return err })
				if !errors.Is(err, mutex.ErrInvalid) || lk != nil {
					t.Errorf("%s: %s with %s = %v, %v; want ErrInvalid", s.Name, a.name, tc.desc, lk, err)
				}
			}
		}
		s.CheckKeys(t, "refused durations")

		accepted := []struct {
			desc   string
			locker *mutex.Locker
			opts   []mutex.Option
			lease  time.Duration
		}{
			{"WithTTL(1ms)", mustNew(t, s.Client, opt, mutex.WithTTL(time.Millisecond)), nil, time.Millisecond},
			{"WithTTL(MaxTTL)", mustNew(t, s.Client, opt, mutex.WithTTL(mutex.MaxTTL)), nil, mutex.MaxTTL},
			{"WithTTL(MaxTTL)", mustNew(t, s.Client, opt), []mutex.Option{mutex.WithTTL(mutex.MaxTTL)}, mutex.MaxTTL},
			{"WithTTL(MaxTTL), WithAutoRenew", mustNew(t, s.Client, opt), []mutex.Option{mutex.WithTTL(mutex.MaxTTL), mutex.WithAutoRenew()}, mutex.MaxTTL},
			{"WithRetryInterval(MaxTTL)", mustNew(t, s.Client, opt, mutex.WithRetryInterval(mutex.MaxTTL)), nil, mutex.DefaultTTL},
		}
		for _, tc := range accepted {
			for _, a := range acquirers {
				name := "long:" + tc.desc + ":" + a.name
				var lk *mutex.Lock
				err := noPanic(func() (err error) { lk, err = a.call(ctx, tc.locker, name, tc.opts...); return err })
				if err != nil {
					t.Errorf("%s: %s with %s = %v", s.Name, a.name, tc.desc, err)
					continue
				}
				if tc.lease > time.Second {
					// Redis keeps the lease in whole milliseconds: the key's
					// TTL is the lease, not a wrapped or negative number.
					ttl, err := s.Client.PTTL(ctx, tc.locker.LockKey(name)).Result()
					if err != nil || ttl <= 0 || ttl > tc.lease || tc.lease-ttl > time.Minute {
						t.Errorf("%s: %s with %s: the lock key's PTTL = %v, %v; want about %v", s.Name, a.name, tc.desc, ttl, err, tc.lease)
					}
					s.CheckKeys(t, a.name+" with "+tc.desc)
				}
				if err := lk.Unlock(ctx); err != nil && !(tc.lease == time.Millisecond && errors.Is(err, mutex.ErrNotHeld)) {
					t.Errorf("%s: Unlock after %s with %s = %v", s.Name, a.name, tc.desc, err)
				}
			}
		}

		// Extend: refused leases leave the lock and its lease untouched.
		l := mustNew(t, s.Client, opt, mutex.WithTTL(time.Minute))
		lk, err := l.TryLock(ctx, "extend")
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range []time.Duration{0, -1, -time.Hour, 999 * time.Microsecond, math.MinInt64, mutex.MaxTTL + time.Millisecond, math.MaxInt64} {
			if err := lk.Extend(ctx, d); !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("%s: Extend(%v) = %v, want ErrInvalid", s.Name, d, err)
			}
		}
		if ttl, err := lk.TTL(ctx); err != nil || ttl <= 50*time.Second || ttl > time.Minute {
			t.Errorf("%s: TTL after refused Extends = %v, %v; want the minute it had", s.Name, ttl, err)
		}
		if err := lk.Extend(ctx, mutex.MaxTTL); err != nil {
			t.Errorf("%s: Extend(MaxTTL) = %v", s.Name, err)
		}
		if ttl, err := lk.TTL(ctx); err != nil || ttl < mutex.MaxTTL-time.Minute {
			t.Errorf("%s: TTL after Extend(MaxTTL) = %v, %v; want about a day", s.Name, ttl, err)
		}
		s.CheckKeys(t, "Extend(MaxTTL)")
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBadInputRetryOfADay: a Lock waiting with the longest retry interval
// accepted (MaxTTL) still tries again just after the holder's lease ends,
// without release notifications, as WithRetryInterval documents. (Before
// MaxTTL, math.MaxInt64 was accepted and Locker.nextWait's retry/2 +
// rand(retry) overflowed to a negative wait for half the draws: the waiter
// then slept until ctx ended.)
func TestBadInputRetryOfADay(t *testing.T) {
	waitForLeaseEnd(t, testutil.Stores(t)[1], mutex.MaxTTL)
}

// waitForLeaseEnd holds 8 names with a 50 ms lease and no Unlock, and waits
// for each with Lock under retry; every waiter must get its lock once the
// lease ended (ctx allows 5 s, a hundred leases).
func waitForLeaseEnd(t *testing.T, s testutil.Store, retry time.Duration) {
	ctx := context.Background()
	holder := mustNew(t, s.Client, mutex.WithPrefix(s.Prefix), mutex.WithTTL(50*time.Millisecond))
	waiter := mustNew(t, s.Client, mutex.WithPrefix(s.Prefix), mutex.WithRetryInterval(retry), mutex.WithoutNotifications())
	const names = 8
	var wg sync.WaitGroup
	errs := make([]error, names)
	for i := range names {
		name := fmt.Sprintf("lapse%d", i)
		if _, err := holder.TryLock(ctx, name); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			lk, err := waiter.Lock(wctx, name)
			if err == nil {
				err = lk.Unlock(ctx)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("waiter %d with a retry interval of %v: %v; want the lock after the holder's 50 ms lease", i, retry, err)
		}
	}
	s.CheckKeys(t, "waiting out leases")
}

// TestBadInputNilAndEmpty: every kind of nil client is refused by New with
// ErrInvalid, and every acquirer of the nil Locker it returns gives
// ErrInvalid, without a panic; zero options are ignored; a Call without a
// Fragment is refused by every entry point that takes one, and leaves the
// lock as it was.
func TestBadInputNilAndEmpty(t *testing.T) {
	ctx := context.Background()
	for desc, c := range testutil.NilClients() {
		var l *mutex.Locker
		err := noPanic(func() (err error) { l, err = mutex.New(c, mutex.WithTTL(time.Second), mutex.Option{}); return err })
		if !errors.Is(err, mutex.ErrInvalid) || l != nil {
			t.Errorf("%s: New = %v, %v; want nil, ErrInvalid", desc, l, err)
		}
		call := mutex.Call{Fragment: badRead, Keys: []string{"k"}}
		for name, f := range map[string]func() error{
			"TryLock":     func() error { _, err := l.TryLock(ctx, "x"); return err },
			"Lock":        func() error { _, err := l.Lock(ctx, "x"); return err },
			"TryLockWith": func() error { _, _, err := l.TryLockWith(ctx, "x", call); return err },
			"LockWith":    func() error { _, _, err := l.LockWith(ctx, "x", call); return err },
		} {
			if err := noPanic(f); !errors.Is(err, mutex.ErrInvalid) {
				t.Errorf("%s: %s of the nil Locker = %v; want ErrInvalid", desc, name, err)
			}
		}
	}

	for _, s := range testutil.Stores(t) {
		l := mustNew(t, s.Client, mutex.Option{}, mutex.WithPrefix(s.Prefix), mutex.Option{})
		lk, err := l.TryLock(ctx, "x", mutex.Option{}, mutex.WithTTL(time.Minute), mutex.Option{})
		if err != nil {
			t.Fatalf("%s: TryLock with zero options = %v", s.Name, err)
		}
		if _, _, err := l.LockWith(ctx, "y", mutex.Call{}); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("%s: LockWith without a Fragment = %v, want ErrInvalid", s.Name, err)
		}
		if _, err := lk.Run(ctx, mutex.Call{Keys: []string{mustKey(t, l, "x", "state")}}); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("%s: Run without a Fragment = %v, want ErrInvalid", s.Name, err)
		}
		if _, err := lk.UnlockWith(ctx, mutex.Call{}); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("%s: UnlockWith without a Fragment = %v, want ErrInvalid", s.Name, err)
		}
		if _, err := l.TryLock(ctx, "x"); !errors.Is(err, mutex.ErrLocked) {
			t.Errorf("%s: after a refused UnlockWith the lock is free (%v); want it still held", s.Name, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Errorf("%s: Unlock after a refused UnlockWith = %v", s.Name, err)
		}
		var nilLock *mutex.Lock
		if err := noPanic(func() error { _, err := nilLock.Run(ctx, mutex.Call{Fragment: badRead}); return err }); !errors.Is(err, mutex.ErrNotHeld) {
			t.Errorf("%s: Run on a nil Lock = %v, want ErrNotHeld", s.Name, err)
		}
		for _, k := range s.Client.Keys(ctx, "*").Val() {
			if !strings.HasSuffix(k, "}:record") { // a release's short-lived record
				t.Errorf("%s: key %q left", s.Name, k)
			}
		}
	}
}

// TestBadInputEndedContexts: a cancelled or expired ctx makes acquirers,
// Extend, TTL and Run fail with an error matching ctx.Err() (Lock and
// LockWith also ErrNotObtained), writes nothing, and leaves a held lock held;
// Unlock and UnlockWith still release (and commit) with an ended ctx.
func TestBadInputEndedContexts(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, s := range testutil.Stores(t) {
		ctx := context.Background()
		l := mustNew(t, s.Client, mutex.WithPrefix(s.Prefix), mutex.WithTTL(time.Minute))
		for _, ended := range []context.Context{cancelled, expired} {
			for _, a := range acquirers {
				lk, err := a.call(ended, l, "free")
				if !errors.Is(err, ended.Err()) || lk != nil {
					t.Errorf("%s: %s with an ended ctx = %v, %v; want %v", s.Name, a.name, lk, err, ended.Err())
				}
				if blocking := strings.HasPrefix(a.name, "Lock"); blocking && !errors.Is(err, mutex.ErrNotObtained) {
					t.Errorf("%s: %s with an ended ctx = %v; want ErrNotObtained too", s.Name, a.name, err)
				}
			}
		}
		if n, _ := s.Client.DBSize(ctx).Result(); n != 0 {
			t.Errorf("%s: acquirers with ended contexts wrote %d keys", s.Name, n)
		}

		lk, err := l.TryLock(ctx, "held")
		if err != nil {
			t.Fatal(err)
		}
		state := mustKey(t, l, "held", "state")
		for _, ended := range []context.Context{cancelled, expired} {
			if err := lk.Extend(ended, time.Hour); !errors.Is(err, ended.Err()) {
				t.Errorf("%s: Extend with an ended ctx = %v, want %v", s.Name, err, ended.Err())
			}
			if _, err := lk.TTL(ended); !errors.Is(err, ended.Err()) {
				t.Errorf("%s: TTL with an ended ctx = %v, want %v", s.Name, err, ended.Err())
			}
			if _, err := lk.Run(ended, mutex.Call{Fragment: badWrite, Keys: []string{state}, Args: []any{"run"}}); !errors.Is(err, ended.Err()) {
				t.Errorf("%s: Run with an ended ctx = %v, want %v", s.Name, err, ended.Err())
			}
		}
		if ttl, err := lk.TTL(ctx); err != nil || ttl > time.Minute || ttl < 50*time.Second {
			t.Errorf("%s: after calls with ended contexts, TTL = %v, %v; want the lock held with its minute", s.Name, ttl, err)
		}
		if n, _ := s.Client.Exists(ctx, state).Result(); n != 0 {
			t.Errorf("%s: Run with an ended ctx wrote the state", s.Name)
		}
		if res, err := lk.UnlockWith(cancelled, mutex.Call{Fragment: badWrite, Keys: []string{state}, Args: []any{"committed"}}); err != nil || res != "committed" {
			t.Errorf("%s: UnlockWith with a cancelled ctx = %v, %v; want it to commit and release", s.Name, res, err)
		}
		if got := s.Client.Get(ctx, state).Val(); got != "committed" {
			t.Errorf("%s: state after UnlockWith with a cancelled ctx = %q", s.Name, got)
		}
		lk, err = l.TryLock(ctx, "held")
		if err != nil {
			t.Fatalf("%s: UnlockWith with a cancelled ctx left the lock held: %v", s.Name, err)
		}
		if err := lk.Unlock(expired); err != nil {
			t.Errorf("%s: Unlock with an expired ctx = %v", s.Name, err)
		}
		s.CheckKeys(t, "ended contexts")
	}
}

// TestKeyRefusesLockerKinds: Key gives no key the Locker writes itself (a
// Fragment writing it would corrupt a lock or a release record), nor one for
// a name no lock may have.
func TestKeyRefusesLockerKinds(t *testing.T) {
	l := mustNew(t, testutil.Mini(t).Client(t), mutex.WithPrefix("k:"))
	for _, kind := range []string{"lock", "fence", "record", "record:0123456789abcdef0123456789abcdef", "record:", "released", ""} {
		if k, err := l.Key("n", kind); !errors.Is(err, mutex.ErrInvalid) || k != "" {
			t.Errorf("Key(n, %q) = %q, %v; want ErrInvalid", kind, k, err)
		}
	}
	for _, name := range []string{"", strings.Repeat("x", mutex.MaxNameLen+1)} {
		if _, err := l.Key(name, "data"); !errors.Is(err, mutex.ErrInvalid) {
			t.Errorf("Key(%d bytes, data) = %v; want ErrInvalid", len(name), err)
		}
	}
	for _, kind := range []string{"data", "locks", "records", "n", "lock:x"} {
		k, err := l.Key("n", kind)
		if err != nil || k != "k:{n}:"+kind {
			t.Errorf("Key(n, %q) = %q, %v; want k:{n}:%s", kind, k, err, kind)
		}
	}
	if got, want := l.LockKey("n"), "k:{n}:lock"; got != want {
		t.Errorf("LockKey(n) = %q, want %q", got, want)
	}
}
