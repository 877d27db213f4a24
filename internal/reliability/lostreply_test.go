package reliability

// Lost replies. go-redis (default options: MaxRetries 3) sends a command
// again when its reply is lost to a dropped connection, after Redis ran it.
// Every write of the toolkit must then report what really happened, once:
// ErrNotHeld means "did not run", always; a denial with err == nil never
// took a unit; one Refund never gives back more than it names.
//
// Each test loses exactly one reply (testutil.LostReply: the command runs,
// its reply is thrown away, the connection closes, go-redis retries on a new
// one), checks that the fault fired, and checks the outcome on the server
// through a client of its own. Each runs on miniredis and on the shared
// redis-server. Locks are taken with long leases, so that nothing in a test
// can come right by waiting for a lease to end.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// lostLease is the lease of every lock of these tests: longer than any
// test's deadline, so a lock left behind blocks its name for the whole test.
const lostLease = time.Minute

// lostRelease matches the release scripts (Unlock, UnlockWith, and the
// commit of a funnel's Allow, Refund and Reset): they alone carry the key of
// the release record, <prefix>{name}:released:<token>.
var lostRelease = testutil.Scripts("}:record:")

// lostIncr is a commit that counts its runs: it returns the new count.
var lostIncr = mutex.NewFragment(`return redis.call('INCR', KEYS[1])`)

// lostIncrTable counts its runs too, and returns a table, which a release
// record does not keep.
var lostIncrTable = mutex.NewFragment(`return {redis.call('INCR', KEYS[1]), 'x'}`)

// A lostEnv is one backend seen through a lost-reply fault: client goes
// through fault, with go-redis's default options; admin reaches the server
// directly, to see what really happened.
type lostEnv struct {
	t      *testing.T
	b      *testutil.Backend
	client *redis.Client
	fault  *testutil.LostReply
	admin  *redis.Client
	ctx    context.Context
}

func newLostEnv(t *testing.T, b *testutil.Backend) *lostEnv {
	t.Helper()
	c, f := b.LostReplyClient(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), faultHang)
	t.Cleanup(cancel)
	return &lostEnv{t: t, b: b, client: c, fault: f, admin: b.Client(t), ctx: ctx}
}

// locker returns a Locker on the fault's client, under the test's prefix.
func (e *lostEnv) locker() *mutex.Locker {
	return mustLocker(e.t, e.client, mutex.WithPrefix(e.b.Prefix))
}

// key returns the key of kind for the lock name, under the test's prefix.
func (e *lostEnv) key(name, kind string) string {
	return keyspace.Key(e.b.Prefix, name, kind) // what Locker.Key returns
}

// lock takes the lock on name through l, with nothing lost.
func (e *lostEnv) lock(t *testing.T, l *mutex.Locker, name string) *mutex.Lock {
	t.Helper()
	lk, err := l.Lock(e.ctx, name, mutex.WithTTL(lostLease))
	if err != nil {
		t.Fatalf("Lock %q: %v", name, err)
	}
	return lk
}

// exists reports whether key is on the server.
func (e *lostEnv) exists(t *testing.T, key string) bool {
	t.Helper()
	n, err := e.admin.Exists(e.ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// get reads an integer key (0 when missing) on the server.
func (e *lostEnv) get(t *testing.T, key string) int64 {
	t.Helper()
	n, err := faultGet(e.ctx, e.admin, key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// gone fails t unless the lock on name is gone from the server.
func (e *lostEnv) gone(t *testing.T, name, after string) {
	t.Helper()
	if key := e.key(name, "lock"); e.exists(t, key) {
		v, _ := e.admin.Get(e.ctx, key).Result()
		t.Fatalf("after %s the lock key %s is still there (%q)", after, key, v)
	}
}

// holds fails t unless the lock on name is on the server under lk's token
// (somewhere in its value: where is the mutex package's business).
func (e *lostEnv) holds(t *testing.T, lk *mutex.Lock, name string) {
	t.Helper()
	v, err := e.admin.Get(e.ctx, e.key(name, "lock")).Result()
	if err != nil || !strings.Contains(v, lk.Token()) {
		t.Fatalf("lock key of %q = %q, %v; want it held under the handle's token %s", name, v, err, lk.Token())
	}
}

// Unlock whose reply is lost: go-redis runs the release again, which finds
// its own record and answers as the first run did. Before the record, the
// retry found no lock and Unlock returned ErrNotHeld for a lock it had
// released.
func TestLostReplyUnlock(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		e := newLostEnv(t, b)
		l := e.locker()
		lk := e.lock(t, l, "unlock")
		e.fault.Drop(lostRelease)
		if err := lk.Unlock(e.ctx); err != nil {
			t.Fatalf("Unlock with its reply lost = %v; want nil: the first run released the lock", err)
		}
		e.fault.ExpectDropped(t, 1)
		e.gone(t, "unlock", "Unlock")
		if err := lk.Unlock(e.ctx); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("second Unlock = %v; want ErrNotHeld: the handle was released", err)
		}
		lk2, err := l.TryLock(e.ctx, "unlock", mutex.WithTTL(lostLease))
		if err != nil {
			t.Fatalf("TryLock after the Unlock = %v; want the lock: it is free", err)
		}
		if err := lk2.Unlock(e.ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// Extend whose reply is lost: the retry sets the same lease again and
// reports the lock held.
func TestLostReplyExtend(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		e := newLostEnv(t, b)
		lk, err := e.locker().Lock(e.ctx, "extend", mutex.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		key := e.key("extend", "lock")
		e.fault.Drop(testutil.Scripts(key))
		if err := lk.Extend(e.ctx, lostLease); err != nil {
			t.Fatalf("Extend with its reply lost = %v; want nil: the lock is held and its lease was set", err)
		}
		e.fault.ExpectDropped(t, 1)
		// More than the lease it had, at most the one asked for: set, not
		// added to.
		if pttl := e.admin.PTTL(e.ctx, key).Val(); pttl <= 10*time.Second || pttl > lostLease {
			t.Fatalf("lease after Extend(%v) = %v; want (10s, %v]", lostLease, pttl, lostLease)
		}
		e.holds(t, lk, "extend")
		if err := lk.Unlock(e.ctx); err != nil {
			t.Fatalf("Unlock after the Extend = %v; want nil", err)
		}
		e.gone(t, "extend", "Unlock")
	})
}

// UnlockWith whose reply is lost: the fragment ran once, and the retry
// returns its result from the release record, not ErrNotHeld (which would
// say it never ran). A table result is not kept: ErrResultUnknown, and
// still one run.
func TestLostReplyUnlockWith(t *testing.T) {
	for _, tc := range []struct {
		name    string
		frag    *mutex.Fragment
		want    any
		wantErr error
	}{
		{"number", lostIncr, int64(1), nil},
		{"table", lostIncrTable, nil, mutex.ErrResultUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
				e := newLostEnv(t, b)
				lk := e.lock(t, e.locker(), "commit")
				counter := e.key("commit", "n")
				e.fault.Drop(lostRelease)
				res, err := lk.UnlockWith(e.ctx, mutex.Call{Fragment: tc.frag, Keys: []string{counter}})
				e.fault.ExpectDropped(t, 1)
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) || res != tc.want {
					t.Fatalf("UnlockWith(INCR) with its reply lost = %v, %v; want %v, %v", res, err, tc.want, tc.wantErr)
				}
				if n := e.get(t, counter); n != 1 {
					t.Fatalf("counter = %d after one UnlockWith; want 1 (the fragment ran once)", n)
				}
				e.gone(t, "commit", "UnlockWith")
			})
		})
	}
}

// An acquire whose reply is lost: go-redis runs it again, and the retry
// finds the lock under its own token, so the call returns the lock, not
// ErrLocked (and not a lock held by nobody's handle for a whole lease).
// Covered: TryLock and Lock by script (a Locker that has not run a script
// yet) and by the native SET NX PX GET (after one), and a re-entry, which
// must list its handle once.
func TestLostReplyAcquire(t *testing.T) {
	for _, tc := range []struct {
		name   string
		warm   bool // the Locker ran a script: a fresh attempt is a SET
		tryOne bool // TryLock, not Lock
	}{
		{"TryLock script", false, true},
		{"TryLock SET", true, true},
		{"Lock script", false, false},
		{"Lock SET", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
				e := newLostEnv(t, b)
				l := e.locker()
				if tc.warm {
					if err := e.lock(t, l, "warm-up").Unlock(e.ctx); err != nil {
						t.Fatal(err)
					}
				}
				const name = "acquire"
				key := e.key(name, "lock")
				match := testutil.Scripts(key)
				if tc.warm {
					match = testutil.All(testutil.Named("set"), func(args []string) bool { return args[1] == key })
				}
				e.fault.Drop(match)
				var lk *mutex.Lock
				var err error
				if tc.tryOne {
					lk, err = l.TryLock(e.ctx, name, mutex.WithTTL(lostLease))
				} else {
					lk, err = l.Lock(e.ctx, name, mutex.WithTTL(lostLease))
				}
				if err != nil {
					t.Fatalf("acquire with its reply lost = %v; want the lock: the first run took it for this call", err)
				}
				e.fault.ExpectDropped(t, 1)
				e.holds(t, lk, name)
				if err := lk.Extend(e.ctx, lostLease); err != nil {
					t.Fatalf("Extend of the lock = %v; want nil", err)
				}
				if err := lk.Unlock(e.ctx); err != nil {
					t.Fatalf("Unlock of the lock = %v; want nil", err)
				}
				e.gone(t, name, "Unlock")
			})
		})
	}
	t.Run("re-entry", func(t *testing.T) {
		testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
			e := newLostEnv(t, b)
			l := e.locker()
			outer := e.lock(t, l, "reenter")
			e.fault.Drop(testutil.Scripts(e.key("reenter", "lock")))
			inner, err := l.TryLock(outer.Context(e.ctx), "reenter")
			if err != nil {
				t.Fatalf("re-entry with its reply lost = %v; want a handle", err)
			}
			e.fault.ExpectDropped(t, 1)
			if err := inner.Unlock(e.ctx); err != nil {
				t.Fatalf("Unlock of the re-entered handle = %v; want nil", err)
			}
			e.holds(t, outer, "reenter")
			if err := outer.Unlock(e.ctx); err != nil {
				t.Fatalf("Unlock of the outer handle = %v; want nil", err)
			}
			// Listed twice, the re-entry would leave a handle nobody has.
			e.gone(t, "reenter", "both handles' Unlock")
		})
	})
}

// A call on a handle after go-redis gave up on a release whose every reply
// was lost (the first run released the lock) is answered by what it is: the
// same call again replays the first run's answer, a different one is
// ErrNotHeld and writes nothing. A release record answers only the very
// call that made it.
func TestLostReplyOtherCallNotReplayed(t *testing.T) {
	// giveUp runs f with every reply of a release lost, and checks that it
	// failed with an unknown outcome (not ErrNotHeld: it did run).
	giveUp := func(t *testing.T, e *lostEnv, what string, f func() error) {
		t.Helper()
		e.fault.DropEvery(lostRelease)
		err := f()
		e.fault.Disarm()
		if err == nil || errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("%s with every reply lost = %v; want a network error (outcome unknown)", what, err)
		}
		if n := e.fault.Dropped(); n < 2 {
			t.Fatalf("%d replies lost; want the first and go-redis's retries", n)
		}
	}
	t.Run("UnlockWith after Unlock", func(t *testing.T) {
		testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
			e := newLostEnv(t, b)
			lk := e.lock(t, e.locker(), "other")
			giveUp(t, e, "Unlock", func() error { return lk.Unlock(e.ctx) })
			e.gone(t, "other", "the lost Unlock")
			counter := e.key("other", "n")
			res, err := lk.UnlockWith(e.ctx, mutex.Call{Fragment: lostIncr, Keys: []string{counter}})
			if !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("UnlockWith after a lost Unlock = %v, %v; want ErrNotHeld: the Unlock released the lock, and this call did not run", res, err)
			}
			if n := e.get(t, counter); n != 0 {
				t.Fatalf("counter = %d; want 0: a call answered ErrNotHeld wrote nothing", n)
			}
		})
	})
	t.Run("Unlock after UnlockWith", func(t *testing.T) {
		testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
			e := newLostEnv(t, b)
			lk := e.lock(t, e.locker(), "other")
			counter := e.key("other", "n")
			giveUp(t, e, "UnlockWith", func() error {
				_, err := lk.UnlockWith(e.ctx, mutex.Call{Fragment: lostIncr, Keys: []string{counter}})
				return err
			})
			if err := lk.Unlock(e.ctx); !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("Unlock after a lost UnlockWith = %v; want ErrNotHeld", err)
			}
			if n := e.get(t, counter); n != 1 {
				t.Fatalf("counter = %d; want 1: the lost UnlockWith ran once, the Unlock not at all", n)
			}
			e.gone(t, "other", "the lost UnlockWith")
		})
	})
	t.Run("the same UnlockWith again", func(t *testing.T) {
		testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
			e := newLostEnv(t, b)
			lk := e.lock(t, e.locker(), "same")
			call := mutex.Call{Fragment: lostIncr, Keys: []string{e.key("same", "n")}}
			giveUp(t, e, "UnlockWith", func() error {
				_, err := lk.UnlockWith(e.ctx, call)
				return err
			})
			res, err := lk.UnlockWith(e.ctx, call)
			if err != nil || res != int64(1) {
				t.Fatalf("the caller's retry of a lost UnlockWith = %v, %v; want 1, nil (the first run's result)", res, err)
			}
			if n := e.get(t, call.Keys[0]); n != 1 {
				t.Fatalf("counter = %d; want 1", n)
			}
			e.gone(t, "same", "UnlockWith")
		})
	})
}

// limiter returns a Limiter on the fault's client, under the test's
// prefix, with a lease that outlasts the test.
func (e *lostEnv) limiter(opts ...funnel.Option) *funnel.Limiter {
	return mustLimiter(e.t, e.client, append([]funnel.Option{funnel.WithPrefix(e.b.Prefix), funnel.WithLease(lostLease)}, opts...)...)
}

// allow runs Allow with nothing lost and fails t on an error or unexpected
// decision.
func (e *lostEnv) allow(t *testing.T, lim *funnel.Limiter, key string, rule funnel.Rule, want bool, what string) funnel.Result {
	t.Helper()
	res, err := lim.Allow(e.ctx, key, rule)
	if err != nil || res.Allowed != want {
		t.Fatalf("%s: Allow = %+v, %v; want allowed %t", what, res, err, want)
	}
	return res
}

// Allow whose commit reply is lost: the call is admitted and takes one
// unit. Before, the commit's retry answered ErrNotHeld, the Limiter decided
// again on the state the first commit wrote, and denied a fresh cooldown key
// with err == nil (its unit taken), or admitted a fresh key of capacity 5
// with Remaining 3 (two units taken).
func TestLostReplyAllow(t *testing.T) {
	t.Run("cooldown", func(t *testing.T) {
		testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
			e := newLostEnv(t, b)
			// Uniform cost: a key with no state goes through the lock
			// and its commit, whose reply is lost.
			lim, rule := e.limiter(funnel.WithUniformCost()), funnel.AtMost(1, time.Minute)
			e.fault.Drop(lostRelease)
			res, err := lim.Allow(e.ctx, "cooldown", rule)
			e.fault.ExpectDropped(t, 1)
			if err != nil || !res.Allowed {
				t.Fatalf("Allow on a fresh key with the commit's reply lost = %+v, %v; want admitted", res, err)
			}
			e.allow(t, lim, "cooldown", rule, false, "the second call within the cooldown")
		})
	})
	t.Run("capacity 5", func(t *testing.T) {
		testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
			e := newLostEnv(t, b)
			lim, rule := e.limiter(funnel.WithUniformCost()), funnel.AtMost(5, time.Hour)
			e.fault.Drop(lostRelease)
			res, err := lim.Allow(e.ctx, "five", rule)
			e.fault.ExpectDropped(t, 1)
			if err != nil || !res.Allowed || res.Remaining != 4 {
				t.Fatalf("Allow on a fresh key of capacity 5 with the commit's reply lost = %+v, %v; want admitted, Remaining 4", res, err)
			}
			peek, err := lim.Peek(e.ctx, "five", rule)
			if err != nil || peek.Remaining != 4 {
				t.Fatalf("Peek after one admission = %+v, %v; want Remaining 4 (one unit taken)", peek, err)
			}
		})
	})
	// A key with no state is admitted by the gate in one round trip
	// (admit.lua); its reply is lost and go-redis runs it again: the retry
	// finds the value it wrote, with its nonce, and answers admitted again,
	// taking nothing more; and no lock is left.
	t.Run("one round trip", func(t *testing.T) {
		testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
			e := newLostEnv(t, b)
			lim, rule := e.limiter(), funnel.AtMost(5, time.Hour)
			// A call with a deadline is admitted in one round trip once
			// the Limiter has a sample of the server's clock (the first
			// goes through the lock).
			e.allow(t, lim, "warm-up", rule, true, "warm-up")
			e.fault.Drop(testutil.Scripts(e.key("fresh", "lock")))
			res, err := lim.Allow(e.ctx, "fresh", rule)
			e.fault.ExpectDropped(t, 1)
			if err != nil || !res.Allowed || res.Remaining != 4 {
				t.Fatalf("Allow on a key with no state, its reply lost = %+v, %v; want admitted, Remaining 4", res, err)
			}
			peek, err := lim.Peek(e.ctx, "fresh", rule)
			if err != nil || peek.Remaining != 4 {
				t.Fatalf("Peek = %+v, %v; want Remaining 4: the retry took nothing", peek, err)
			}
			e.gone(t, "fresh", "Allow")
			e.allow(t, lim, "fresh", rule, true, "the second call, through the lock")
		})
	})
	// The acquire with the read (a gate) loses its reply: its retry finds
	// the lock its own, and the call goes on, without waiting out the lease
	// of a lock that nobody would hold.
	t.Run("acquire", func(t *testing.T) {
		testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
			e := newLostEnv(t, b)
			lim, rule := e.limiter(funnel.WithUniformCost()), funnel.AtMost(5, time.Hour)
			lockKey := e.key("gate", "lock")
			e.fault.Drop(func(args []string) bool { return testutil.Scripts(lockKey)(args) && !lostRelease(args) })
			res, err := lim.Allow(e.ctx, "gate", rule)
			e.fault.ExpectDropped(t, 1)
			if err != nil || !res.Allowed || res.Remaining != 4 {
				t.Fatalf("Allow with the acquire's reply lost = %+v, %v; want admitted, Remaining 4", res, err)
			}
			e.gone(t, "gate", "Allow")
		})
	})
}

// Refund whose commit reply is lost gives back what it names, once. Before,
// Refund(1) on a full AtMost(2, time.Hour) committed twice and 2 more calls
// were admitted.
func TestLostReplyRefund(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		e := newLostEnv(t, b)
		lim, rule := e.limiter(), funnel.AtMost(2, time.Hour)
		e.allow(t, lim, "refund", rule, true, "1st call")
		e.allow(t, lim, "refund", rule, true, "2nd call")
		e.allow(t, lim, "refund", rule, false, "3rd call (full)")
		e.fault.Drop(lostRelease)
		if err := lim.Refund(e.ctx, "refund", 1, rule); err != nil {
			t.Fatalf("Refund(1) with the commit's reply lost = %v; want nil", err)
		}
		e.fault.ExpectDropped(t, 1)
		e.allow(t, lim, "refund", rule, true, "the call after Refund(1)")
		e.allow(t, lim, "refund", rule, false, "the next: Refund(1) gave one unit back, not two")
	})
}

// Reset whose commit reply is lost returns nil and the state is gone, in
// one commit: the retry of the lost one, not a new lock round (a DEL run
// twice looks the same on the server; the round trips tell them apart).
func TestLostReplyReset(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		e := newLostEnv(t, b)
		lim, rule := e.limiter(), funnel.AtMost(1, time.Minute)
		// A Reset of another key first: the reset script is then in the
		// server's cache, and each commit is one EVALSHA (the count below
		// would otherwise include an EVALSHA answered NOSCRIPT).
		if err := lim.Reset(e.ctx, "warm-up"); err != nil {
			t.Fatal(err)
		}
		e.allow(t, lim, "reset", rule, true, "1st call")
		state := e.key("reset", "f")
		if !e.exists(t, state) {
			t.Fatalf("no funnel state at %s after an admission", state)
		}
		before := e.fault.Sent(lostRelease)
		e.fault.Drop(lostRelease)
		if err := lim.Reset(e.ctx, "reset"); err != nil {
			t.Fatalf("Reset with the commit's reply lost = %v; want nil", err)
		}
		e.fault.ExpectDropped(t, 1)
		if e.exists(t, state) {
			t.Fatalf("funnel state %s still there after Reset", state)
		}
		e.gone(t, "reset", "Reset")
		if n := e.fault.Sent(lostRelease) - before; n != 2 {
			t.Fatalf("Reset sent %d commits; want 2: the lost one and go-redis's retry of it", n)
		}
		e.allow(t, lim, "reset", rule, true, "the call after Reset")
	})
}

// guard.Do: the refund after fn failed loses its reply, and still gives
// back one unit, once; an admission whose reply is lost runs fn once and
// takes one unit.
func TestLostReplyGuardDo(t *testing.T) {
	errSend := errors.New("provider refused the message")
	newGuard := func(t *testing.T, e *lostEnv) *guard.Guard {
		t.Helper()
		// Uniform cost: the admission of a key with no state goes through
		// the lock and its commit, whose reply the tests lose.
		g, err := guard.New(e.client,
			guard.WithPrefix(e.b.Prefix),
			guard.WithRules(funnel.AtMost(3, time.Hour)),
			guard.WithTimeout(faultHang),
			guard.WithFunnel(funnel.WithUniformCost()),
		)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	remaining := func(t *testing.T, e *lostEnv, g *guard.Guard, want int64, what string) {
		t.Helper()
		d, err := g.Peek(e.ctx, "do")
		if err != nil || d.Remaining != want {
			t.Fatalf("%s: Peek = %+v, %v; want Remaining %d", what, d, err, want)
		}
	}
	t.Run("refund lost", func(t *testing.T) {
		testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
			e := newLostEnv(t, b)
			g := newGuard(t, e)
			if d, err := g.Allow(e.ctx, "do"); err != nil || !d.Allowed {
				t.Fatalf("Allow = %+v, %v", d, err)
			}
			runs := 0
			d, err := g.Do(e.ctx, "do", func(context.Context) error {
				runs++
				e.fault.Drop(lostRelease) // the refund's commit comes next
				return errSend
			})
			e.fault.ExpectDropped(t, 1)
			if err != errSend || !d.Allowed || runs != 1 {
				t.Fatalf("Do = %+v, %v after %d runs; want admitted, fn's error alone (the refund succeeded), 1 run", d, err, runs)
			}
			remaining(t, e, g, 2, "after Allow and a refunded Do")
		})
	})
	t.Run("admission lost", func(t *testing.T) {
		testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
			e := newLostEnv(t, b)
			g := newGuard(t, e)
			runs := 0
			e.fault.Drop(lostRelease)
			d, err := g.Do(e.ctx, "do", func(context.Context) error { runs++; return nil })
			e.fault.ExpectDropped(t, 1)
			if err != nil || !d.Allowed || runs != 1 || d.Remaining != 2 {
				t.Fatalf("Do with the admission's reply lost = %+v, %v after %d runs; want admitted, Remaining 2, 1 run", d, err, runs)
			}
			remaining(t, e, g, 2, "after one Do")
		})
	})
}

// An Unlock whose outcome is unknown (its release ran, its reply was lost,
// and a client without retries reports the error) leaves the handle open.
// The caller's second Unlock must not pass the lock to a local waiter
// without Redis: the lock may be gone from Redis, and taken by another
// Locker. It makes the first release's call again, which that release's
// record answers, and the waiter gets the lock from Redis, under a token of
// its own, once the other Locker lets it go.
func TestLostReplyUnlockAgainHandsNothingOver(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		c, f := b.LostReplyClient(t, &redis.Options{MaxRetries: -1})
		ctx, cancel := context.WithTimeout(context.Background(), faultHang)
		defer cancel()
		admin := b.Client(t)
		a := mustLocker(t, c, mutex.WithPrefix(b.Prefix))
		other := mustLocker(t, admin, mutex.WithPrefix(b.Prefix))
		key := a.LockKey("h")

		lk, err := a.Lock(ctx, "h", mutex.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		f.Drop(lostRelease)
		if err := lk.Unlock(ctx); err == nil || errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("Unlock with its reply lost and no retry = %v; want an unknown outcome", err)
		}
		f.ExpectDropped(t, 1)
		// The release ran: another Locker takes the lock.
		held, err := other.TryLock(ctx, "h", mutex.WithTTL(time.Minute))
		if err != nil {
			t.Fatalf("another Locker's TryLock after the release ran = %v", err)
		}
		// A waiter of the first Locker queues for the name.
		got := queueWaiter(ctx, t, a, admin, "h")
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("the second Unlock = %v; want nil from the first release's record", err)
		}
		if err := held.Unlock(ctx); err != nil {
			t.Fatalf("the other Locker's Unlock = %v; it held the lock all along", err)
		}
		res := <-got
		w := res.lk
		if res.err != nil || w == nil {
			t.Fatalf("the waiter got no lock: %v", res.err)
		}
		defer w.Unlock(ctx)
		if w.Token() == lk.Token() {
			t.Fatal("the second Unlock passed its token to the waiter while another Locker held the lock")
		}
		if v := admin.Get(ctx, key).Val(); !strings.Contains(v, w.Token()) {
			t.Fatalf("the lock holds %q, not the waiter's token", v)
		}
	})
}

// The same, when the release whose outcome is unknown handed the lock to a
// local waiter in Redis (its lease too short for a hand-over without a
// round trip): the second Unlock makes that hand-over's call again, which
// its record answers, and the waiter gets the lock Redis holds for it
// rather than waiting out a lease nobody holds.
func TestLostReplyUnlockAgainRepeatsTheHandOver(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		c, f := b.LostReplyClient(t, &redis.Options{MaxRetries: -1})
		ctx, cancel := context.WithTimeout(context.Background(), faultHang)
		defer cancel()
		admin := b.Client(t)
		a := mustLocker(t, c, mutex.WithPrefix(b.Prefix))
		key := a.LockKey("g")

		lk, err := a.Lock(ctx, "g", mutex.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := queueWaiter(ctx, t, a, admin, "g")
		f.Drop(lostRelease)
		if err := lk.Unlock(ctx); err == nil || errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("Unlock with its reply lost and no retry = %v; want an unknown outcome", err)
		}
		f.ExpectDropped(t, 1)
		handed := admin.Get(ctx, key).Val()
		if handed == "" || strings.Contains(handed, lk.Token()) {
			t.Fatalf("after the lost release the lock holds %q; want it handed to a new token", handed)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("the second Unlock = %v; want nil from the first release's record", err)
		}
		var w *mutex.Lock
		select {
		case res := <-got:
			if res.err != nil {
				t.Fatalf("the waiter's Lock = %v", res.err)
			}
			w = res.lk
		case <-ctx.Done():
			t.Fatal("the waiter did not get the lock handed to it")
		}
		if w == nil || !strings.Contains(handed, w.Token()) {
			t.Fatalf("the waiter holds %v; want the token Redis handed the lock to (in %q)", w, handed)
		}
		if err := w.Unlock(ctx); err != nil {
			t.Fatalf("the waiter's Unlock = %v", err)
		}
	})
}

// queueWaiter starts a Lock of name through l (a minute's lease) and returns
// once it waits, that is, once it has marked the lock for a notification
// (read through admin) and joined l's queue; the Lock's result comes on the
// channel. The lock is held, by a holder that does nothing while the
// waiter queues: the mark is the one change of its value. (A token is in
// the value, and the mark too, but where is the mutex package's business.)
func queueWaiter(ctx context.Context, t *testing.T, l *mutex.Locker, admin *redis.Client, name string) <-chan waited {
	t.Helper()
	key := l.LockKey(name)
	held := admin.Get(ctx, key).Val() // before the waiter may mark it
	if held == "" {
		t.Fatal("the lock is not held: the waiter would not wait")
	}
	got := make(chan waited, 1)
	// The goroutine reports through got, never through t: it may end after
	// the test has (a test that failed before reading got).
	go func() {
		w, err := l.Lock(ctx, name, mutex.WithTTL(time.Minute))
		got <- waited{w, err}
	}()
	for {
		// Marked in Redis, and queued in l (it marks first).
		if v := admin.Get(ctx, key).Val(); v != "" && v != held && l.Waiters(name) > 0 {
			return got
		}
		if ctx.Err() != nil {
			t.Fatal("the waiter never queued")
		}
		time.Sleep(time.Millisecond)
	}
}

// waited is what queueWaiter's Lock returned.
type waited struct {
	lk  *mutex.Lock
	err error
}
