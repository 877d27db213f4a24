package funnel_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// Bad input beyond input_test.go: key-length boundaries up to 10 MiB with a
// count of the commands sent, extreme rules (Per of 1 ns and of 100 years,
// Capacity and Leak at and past their limits), ':' in keys and rule names,
// nil clients of every kind, bad Lockers and ended contexts, on miniredis
// and on a redis-server of the test's own. Each case must give the
// documented error (matched with errors.Is) or behaviour, never panic, and
// leave no key outside the test's prefix or without a TTL.

// badEntry is one entry point of a Limiter, as one signature.
type badEntry struct {
	name string
	call func(ctx context.Context, lim *funnel.Limiter, key string, n int64, rules ...funnel.Rule) error
}

var badEntries = []badEntry{
	{"Allow", func(ctx context.Context, lim *funnel.Limiter, key string, _ int64, rules ...funnel.Rule) error {
		_, err := lim.Allow(ctx, key, rules...)
		return err
	}},
	{"AllowN", func(ctx context.Context, lim *funnel.Limiter, key string, n int64, rules ...funnel.Rule) error {
		_, err := lim.AllowN(ctx, key, n, rules...)
		return err
	}},
	{"Peek", func(ctx context.Context, lim *funnel.Limiter, key string, _ int64, rules ...funnel.Rule) error {
		_, err := lim.Peek(ctx, key, rules...)
		return err
	}},
	{"Refund", func(ctx context.Context, lim *funnel.Limiter, key string, n int64, rules ...funnel.Rule) error {
		return lim.Refund(ctx, key, n, rules...)
	}},
	{"Reset", func(ctx context.Context, lim *funnel.Limiter, key string, _ int64, _ ...funnel.Rule) error {
		return lim.Reset(ctx, key)
	}},
}

// safeCall runs e and turns a panic into an error.
func safeCall(e badEntry, ctx context.Context, lim *funnel.Limiter, key string, n int64, rules ...funnel.Rule) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return e.call(ctx, lim, key, n, rules...)
}

// noPanic runs f and turns a panic into an error.
func noPanic(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return f()
}

var badRule = funnel.Rule{Name: "r", Capacity: 2, Leak: 1, Per: time.Second}

// TestBadInputKeyLength: keys of 0, MaxKeyLen+1, 1 MiB and 10 MiB bytes are
// refused by every entry point with ErrInvalidKey before any command is
// sent; a key of exactly MaxKeyLen (1 KiB) works everywhere.
func TestBadInputKeyLength(t *testing.T) {
	for _, s := range testutil.Stores(t) {
		ctx := context.Background()
		lim := mustLimiter(t, s.Client, funnel.WithPrefix(s.Prefix))
		for _, n := range []int{0, funnel.MaxKeyLen + 1, 1 << 20, 10 << 20} {
			key := strings.Repeat("k", n)
			before := s.Cmds.N.Load()
			for _, e := range badEntries {
				if err := safeCall(e, ctx, lim, key, 1, badRule); !errors.Is(err, funnel.ErrInvalidKey) {
					t.Errorf("%s: %s with a %d-byte key = %.100v, want ErrInvalidKey", s.Name, e.name, n, err)
				}
			}
			if sent := s.Cmds.N.Load() - before; sent != 0 {
				t.Errorf("%s: a %d-byte key sent %d commands; want it refused before Redis", s.Name, n, sent)
			}
		}
		key := strings.Repeat("k", funnel.MaxKeyLen)
		for _, e := range badEntries {
			if err := safeCall(e, ctx, lim, key, 1, badRule); err != nil {
				t.Errorf("%s: %s with a key of MaxKeyLen bytes = %v", s.Name, e.name, err)
			}
			s.CheckKeys(t, e.name+" with a 1 KiB key")
		}
	}
}

// TestBadInputExtremeRules: rules at the edges of what exact arithmetic
// allows are refused with ErrInvalidRule, or accepted and then decided
// without overflow: no negative RetryAfter, Remaining or ResetAfter, and the
// state key has a TTL.
func TestBadInputExtremeRules(t *testing.T) {
	const century = 100 * 365 * 24 * time.Hour
	maxPerMicros := time.Duration(math.MaxInt64).Truncate(time.Microsecond)
	for _, s := range testutil.Stores(t) {
		ctx := context.Background()
		lim := mustLimiter(t, s.Client, funnel.WithPrefix(s.Prefix))
		refused := map[string]funnel.Rule{
			"Per 1ns":                        {Name: "r", Capacity: 1, Leak: 1, Per: time.Nanosecond},
			"Per 999ns":                      {Name: "r", Capacity: 1, Leak: 1, Per: 999 * time.Nanosecond},
			"Per MinInt64":                   {Name: "r", Capacity: 1, Leak: 1, Per: math.MinInt64},
			"Per MaxInt64 (not whole µs)":    {Name: "r", Capacity: 1, Leak: 1, Per: math.MaxInt64},
			"Capacity MaxInt64":              {Name: "r", Capacity: math.MaxInt64, Leak: 1, Per: time.Microsecond},
			"Capacity MinInt64":              {Name: "r", Capacity: math.MinInt64, Leak: 1, Per: time.Second},
			"Leak MaxInt64":                  {Name: "r", Capacity: 1, Leak: math.MaxInt64, Per: time.Second},
			"Leak MinInt64":                  {Name: "r", Capacity: 1, Leak: math.MinInt64, Per: time.Second},
			"Capacity 732 per 100 years":     {Name: "r", Capacity: 732, Leak: 1, Per: century}, // 732 * 100 y in µs > 2^61
			"Capacity 251 per MaxInt64 ns":   {Name: "r", Capacity: 251, Leak: 1, Per: maxPerMicros},
			"Capacity 2^61+1 per µs":         {Name: "r", Capacity: 1<<61 + 1, Leak: 1, Per: time.Microsecond},
			"Leak 2^61+1":                    {Name: "r", Capacity: 1, Leak: 1<<61 + 1, Per: time.Microsecond},
			"Capacity * Per wraps to 2^64+1": {Name: "r", Capacity: 274177, Leak: 1, Per: 67280421310721 * time.Microsecond},
		}
		for desc, r := range refused {
			if err := funnel.Validate(r); !errors.Is(err, funnel.ErrInvalidRule) {
				t.Errorf("Validate(%s) = %v, want ErrInvalidRule", desc, err)
			}
			for _, e := range badEntries[:4] {
				if err := safeCall(e, ctx, lim, "k", 1, r); !errors.Is(err, funnel.ErrInvalidRule) {
					t.Errorf("%s: %s with %s = %v, want ErrInvalidRule", s.Name, e.name, desc, err)
				}
			}
		}
		if n, _ := s.Client.DBSize(ctx).Result(); n != 0 {
			t.Errorf("%s: refused rules wrote %d keys", s.Name, n)
		}

		accepted := []struct {
			desc string
			rule funnel.Rule
			n    int64 // AllowN's units: the rule's whole capacity
		}{
			{"Per 1µs", funnel.Rule{Name: "r", Capacity: 1, Leak: 1, Per: time.Microsecond}, 1},
			{"Capacity 1 per 100 years", funnel.Rule{Name: "r", Capacity: 1, Leak: 1, Per: century}, 1},
			{"Capacity 731 per 100 years", funnel.Rule{Name: "r", Capacity: 731, Leak: 1, Per: century}, 731},
			{"AtMost(3, 100 years)", funnel.AtMost(3, century), 3},
			{"Capacity 250 per MaxInt64 ns, in µs", funnel.Rule{Name: "r", Capacity: 250, Leak: 1, Per: maxPerMicros}, 250},
			{"Capacity 2^61 per µs", funnel.Rule{Name: "r", Capacity: 1 << 61, Leak: 1, Per: time.Microsecond}, 1 << 61},
			{"Leak 2^61 per µs", funnel.Rule{Name: "r", Capacity: 1, Leak: 1 << 61, Per: time.Microsecond}, 1},
			{"Capacity 2^61 leaking 2^61 per 1µs", funnel.Rule{Name: "r", Capacity: 1 << 61, Leak: 1 << 61, Per: time.Microsecond}, 1 << 61},
		}
		for i, tc := range accepted {
			key := fmt.Sprintf("edge%d", i)
			// allowed: 1 yes, 0 no, -1 either (a funnel that drains in a
			// microsecond may be empty again by the next call).
			check := func(what string, res funnel.Result, err error, allowed int) {
				t.Helper()
				if err != nil || (allowed >= 0 && res.Allowed != (allowed == 1)) || res.RetryAfter < 0 || res.Remaining < 0 || res.ResetAfter < 0 {
					t.Errorf("%s: %s, %s = %+v, %v; want allowed %d and no negative figure", s.Name, tc.desc, what, res, err, allowed)
				}
			}
			res, err := lim.AllowN(ctx, key, tc.n, tc.rule)
			check("AllowN(capacity)", res, err, 1)
			res, err = lim.Peek(ctx, key, tc.rule)
			check("Peek after", res, err, -1)
			if tc.rule.Per >= time.Hour && !(s.Name == "miniredis" && drainsPast292Years(tc.rule)) {
				res, err = lim.Allow(ctx, key, tc.rule)
				check("Allow of a full funnel", res, err, 0)
				if res.RetryAfter < tc.rule.Per/time.Duration(tc.rule.Leak)-time.Minute {
					t.Errorf("%s: %s: RetryAfter = %v, want about %v", s.Name, tc.desc, res.RetryAfter, tc.rule.Per/time.Duration(tc.rule.Leak))
				}
			}
			if err := lim.Refund(ctx, key, math.MaxInt64, tc.rule); err != nil {
				t.Errorf("%s: %s: Refund(MaxInt64) = %v", s.Name, tc.desc, err)
			}
			if res, err := lim.Allow(ctx, key, tc.rule); err != nil || !res.Allowed {
				t.Errorf("%s: %s: Allow after a full refund = %+v, %v", s.Name, tc.desc, res, err)
			}
			s.CheckKeys(t, tc.desc)
		}
	}
}

// drainsPast292Years reports whether a full funnel of r takes longer to
// drain than a time.Duration can hold: its state key's TTL is then more
// than miniredis can keep (see TestBadInputBugStateTTLPast292Years).
func drainsPast292Years(r funnel.Rule) bool {
	perMicros := int64(r.Per / time.Microsecond)
	return float64(r.Capacity)*float64(perMicros)/float64(r.Leak) > float64(math.MaxInt64/int64(time.Microsecond))
}

// TestBadInputBugStateTTLPast292Years: a rule whose full funnel drains in
// more than 292 years (AtMost(3, 100 years), the largest valid capacities)
// gets a state TTL in milliseconds that real Redis keeps but miniredis (the
// example's embedded Redis) turns into a time.Duration that overflows: the
// key is gone at once and the rule admits every call. Fixed: the
// regression test.
func TestBadInputBugStateTTLPast292Years(t *testing.T) {
	s := testutil.Stores(t)[0]
	ctx := context.Background()
	lim := mustLimiter(t, s.Client, funnel.WithPrefix(s.Prefix))
	rule := funnel.AtMost(3, 100*365*24*time.Hour)
	for i := range 4 {
		res, err := lim.Allow(ctx, "lifetime", rule)
		if err != nil || res.Allowed != (i < 3) {
			t.Errorf("call %d under %s on miniredis = %+v, %v; want 3 admitted, then denied", i+1, rule.Name, res, err)
		}
	}
}

// TestBadInputUnits: n of 0, -1, MinInt64 and MaxInt64 are refused by AllowN
// (MaxInt64 is above any capacity) and the non-positive ones by Refund;
// Refund of MaxInt64 empties the funnel and never goes below empty.
func TestBadInputUnits(t *testing.T) {
	s := testutil.Stores(t)[0]
	ctx := context.Background()
	lim := mustLimiter(t, s.Client, funnel.WithPrefix(s.Prefix))
	for _, n := range []int64{0, -1, math.MinInt64, math.MaxInt64} {
		if _, err := lim.AllowN(ctx, "k", n, badRule); !errors.Is(err, funnel.ErrInvalidN) {
			t.Errorf("AllowN(%d) = %v, want ErrInvalidN", n, err)
		}
		if err := lim.Refund(ctx, "k", n, badRule); n <= 0 && !errors.Is(err, funnel.ErrInvalidN) {
			t.Errorf("Refund(%d) = %v, want ErrInvalidN", n, err)
		} else if n > 0 && err != nil {
			t.Errorf("Refund(%d) = %v", n, err)
		}
	}
	if res, err := lim.AllowN(ctx, "k", 2, badRule); err != nil || !res.Allowed || res.Remaining != 0 {
		t.Fatalf("AllowN(2) after refunds = %+v, %v; want the whole capacity, never below empty", res, err)
	}
	s.CheckKeys(t, "units")
}

// TestBadInputColons: keys and rule names that read like other keys, kinds
// or rule ids ('/' separates a rule id's parts) each get a funnel of their
// own, and a key never reaches the lock or state of another.
func TestBadInputColons(t *testing.T) {
	for _, s := range testutil.Stores(t) {
		ctx := context.Background()
		lim := mustLimiter(t, s.Client, funnel.WithPrefix(s.Prefix))
		one := funnel.AtMost(1, time.Hour)
		keys := []string{"a", "a:funnel", "a:lock", "{a}:funnel", "a}:funnel", "a:", ":", "funnel", "lock", "{a}", "k*", "k?", "k[1]",
			"') redis.call('FLUSHALL') --", "\x00", "a\r\nb"}
		for _, k := range keys {
			if res, err := lim.Allow(ctx, k, one); err != nil || !res.Allowed {
				t.Fatalf("%s: first Allow(%q) = %+v, %v; want a funnel of its own", s.Name, k, res, err)
			}
		}
		for _, k := range keys {
			if res, err := lim.Allow(ctx, k, one); err != nil || res.Allowed {
				t.Fatalf("%s: second Allow(%q) = %+v, %v; want denied", s.Name, k, res, err)
			}
		}
		if n := testutil.CountKeys(ctx, s.Client); n != int64(len(keys)) {
			t.Errorf("%s: %d keys for %d funnel keys; want one state key each", s.Name, n, len(keys))
		}
		// Rule names that embed another rule's id ("r/1/1/3600000000" is
		// rule "r" of capacity 1, leak 1 per hour) each get a funnel.
		rules := []funnel.Rule{
			{Name: "r", Capacity: 1, Leak: 1, Per: time.Hour},
			{Name: "r/1/1/3600000000", Capacity: 1, Leak: 1, Per: time.Hour},
			{Name: "r/1", Capacity: 1, Leak: 1, Per: time.Hour},
			{Name: "{r}:lock", Capacity: 1, Leak: 1, Per: time.Hour},
			{Name: "]]..redis.call('DEL', KEYS[1])..[[", Capacity: 1, Leak: 1, Per: time.Hour},
			{Name: strings.Repeat("/", funnel.MaxRuleName), Capacity: 1, Leak: 1, Per: time.Hour},
		}
		for _, r := range rules {
			if res, err := lim.Allow(ctx, "rules", r); err != nil || !res.Allowed {
				t.Errorf("%s: Allow with rule %q = %+v, %v; want its own funnel", s.Name, r.Name, res, err)
			}
		}
		if res, err := lim.Peek(ctx, "rules", rules...); err != nil || res.Allowed {
			t.Errorf("%s: Peek with every rule = %+v, %v; want each full", s.Name, res, err)
		}
		s.CheckKeys(t, "colons")
	}
}

// TestBadInputNilAndLockers: New refuses nil clients of every kind and bad
// options (a nil Locker, a quorum Locker, bad leases and prefixes) with
// ErrInvalidOption, without a panic; every entry point of the nil Limiter
// it returns gives ErrInvalidOption too; nil options are ignored.
func TestBadInputNilAndLockers(t *testing.T) {
	ctx := context.Background()
	for desc, c := range testutil.NilClients() {
		var lim *funnel.Limiter
		err := noPanic(func() (err error) { lim, err = funnel.New(c, nil, funnel.WithLease(time.Second)); return err })
		if !errors.Is(err, funnel.ErrInvalidOption) || lim != nil {
			t.Errorf("%s: New = %v, %v; want nil, ErrInvalidOption", desc, lim, err)
		}
		for _, e := range badEntries {
			if err := safeCall(e, ctx, lim, "k", 1, badRule); !errors.Is(err, funnel.ErrInvalidOption) {
				t.Errorf("%s: %s of the nil Limiter = %v, want ErrInvalidOption", desc, e.name, err)
			}
		}
	}
	var quorum []mutex.Client
	for range mutex.MinQuorumNodes {
		quorum = append(quorum, testutil.Mini(t).ClientOpts(t, &redis.Options{ContextTimeoutEnabled: true}))
	}
	q, err := mutex.NewQuorum(quorum)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range testutil.Stores(t) {
		for desc, o := range map[string]funnel.Option{
			"a nil Locker":        funnel.WithLocker(nil),
			"a quorum Locker":     funnel.WithLocker(q),
			"WithLease(-1)":       funnel.WithLease(-1),
			"WithLease(MinInt64)": funnel.WithLease(math.MinInt64),
			"WithLease(MaxInt64)": funnel.WithLease(math.MaxInt64),
			"WithLease(MaxTTL+1)": funnel.WithLease(mutex.MaxTTL + time.Millisecond),
			"a 257-byte prefix":   funnel.WithPrefix(strings.Repeat("p", 257)),
		} {
			var lim *funnel.Limiter
			err := noPanic(func() (err error) { lim, err = funnel.New(s.Client, funnel.WithPrefix(s.Prefix), o); return err })
			if !errors.Is(err, funnel.ErrInvalidOption) || lim != nil {
				t.Errorf("%s: New with %s = %v, %v; want nil, ErrInvalidOption", s.Name, desc, lim, err)
			}
		}
		lim := mustLimiter(t, s.Client, nil, funnel.WithPrefix(s.Prefix), nil, funnel.WithLease(mutex.MaxTTL))
		if res, err := lim.Allow(ctx, "long lease", badRule); err != nil || !res.Allowed {
			t.Errorf("%s: Allow with WithLease(mutex.MaxTTL) = %+v, %v", s.Name, res, err)
		}
		s.CheckKeys(t, "Lockers and options")
	}
}

// TestBadInputEndedContexts: every entry point with a cancelled or expired
// ctx fails with an error matching ctx.Err(), and takes nothing.
func TestBadInputEndedContexts(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, s := range testutil.Stores(t) {
		ctx := context.Background()
		lim := mustLimiter(t, s.Client, funnel.WithPrefix(s.Prefix))
		if _, err := lim.Allow(ctx, "k", badRule); err != nil {
			t.Fatal(err)
		}
		for _, ended := range []context.Context{cancelled, expired} {
			for _, e := range badEntries {
				if err := safeCall(e, ended, lim, "k", 1, badRule); !errors.Is(err, ended.Err()) {
					t.Errorf("%s: %s with an ended ctx = %v, want %v", s.Name, e.name, err, ended.Err())
				}
			}
		}
		if res, err := lim.Peek(ctx, "k", badRule); err != nil || res.Remaining != 1 {
			t.Errorf("%s: after calls with ended contexts, Peek = %+v, %v; want 1 unit left, as before", s.Name, res, err)
		}
		s.CheckKeys(t, "ended contexts")
	}
}
