package funnel_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// TestBadInput checks that every entry point turns bad input into the right
// error before touching Redis, and that odd but valid keys stay data.
func TestBadInput(t *testing.T) {
	b := testutil.Mini(t)
	ctx := context.Background()
	good := funnel.Rule{Name: "r", Capacity: 2, Leak: 1, Per: time.Second}

	type entry struct {
		name string
		call func(lim *funnel.Limiter, key string, n int64, rules []funnel.Rule) error
	}
	allow := entry{"Allow", func(lim *funnel.Limiter, key string, _ int64, rules []funnel.Rule) error {
		_, err := lim.Allow(ctx, key, rules...)
		return err
	}}
	allowN := entry{"AllowN", func(lim *funnel.Limiter, key string, n int64, rules []funnel.Rule) error {
		_, err := lim.AllowN(ctx, key, n, rules...)
		return err
	}}
	peek := entry{"Peek", func(lim *funnel.Limiter, key string, _ int64, rules []funnel.Rule) error {
		_, err := lim.Peek(ctx, key, rules...)
		return err
	}}
	refund := entry{"Refund", func(lim *funnel.Limiter, key string, n int64, rules []funnel.Rule) error {
		return lim.Refund(ctx, key, n, rules...)
	}}
	reset := entry{"Reset", func(lim *funnel.Limiter, key string, _ int64, _ []funnel.Rule) error {
		return lim.Reset(ctx, key)
	}}
	all := []entry{allow, allowN, peek, refund, reset}
	withRules := []entry{allow, allowN, peek, refund}

	lim := newLimiter(t, b)
	rule := func(f func(r *funnel.Rule)) []funnel.Rule {
		r := good
		f(&r)
		return []funnel.Rule{r}
	}
	cases := []struct {
		desc    string
		lim     *funnel.Limiter
		key     string
		n       int64
		rules   []funnel.Rule
		want    error
		entries []entry
	}{
		{"empty key", lim, "", 1, []funnel.Rule{good}, funnel.ErrInvalidKey, all},
		{"key of MaxKeyLen+1 bytes", lim, strings.Repeat("k", funnel.MaxKeyLen+1), 1, []funnel.Rule{good}, funnel.ErrInvalidKey, all},
		{"key of 10 MiB", lim, strings.Repeat("k", 10<<20), 1, []funnel.Rule{good}, funnel.ErrInvalidKey, all},
		{"no rules", lim, "k", 1, nil, funnel.ErrInvalidRule, withRules},
		{"empty rule name", lim, "k", 1, rule(func(r *funnel.Rule) { r.Name = "" }), funnel.ErrInvalidRule, withRules},
		{"long rule name", lim, "k", 1, rule(func(r *funnel.Rule) { r.Name = strings.Repeat("n", funnel.MaxRuleName+1) }), funnel.ErrInvalidRule, withRules},
		{"Capacity 0", lim, "k", 1, rule(func(r *funnel.Rule) { r.Capacity = 0 }), funnel.ErrInvalidRule, withRules},
		{"Capacity -1", lim, "k", 1, rule(func(r *funnel.Rule) { r.Capacity = -1 }), funnel.ErrInvalidRule, withRules},
		{"Leak 0", lim, "k", 1, rule(func(r *funnel.Rule) { r.Leak = 0 }), funnel.ErrInvalidRule, withRules},
		{"Leak -1", lim, "k", 1, rule(func(r *funnel.Rule) { r.Leak = -1 }), funnel.ErrInvalidRule, withRules},
		{"Per 0", lim, "k", 1, rule(func(r *funnel.Rule) { r.Per = 0 }), funnel.ErrInvalidRule, withRules},
		{"Per -1s", lim, "k", 1, rule(func(r *funnel.Rule) { r.Per = -time.Second }), funnel.ErrInvalidRule, withRules},
		{"Per 500ns", lim, "k", 1, rule(func(r *funnel.Rule) { r.Per = 500 * time.Nanosecond }), funnel.ErrInvalidRule, withRules},
		{"Per 1.5µs", lim, "k", 1, rule(func(r *funnel.Rule) { r.Per = 1500 * time.Nanosecond }), funnel.ErrInvalidRule, withRules},
		{"Capacity*Per overflow", lim, "k", 1, rule(func(r *funnel.Rule) { r.Capacity, r.Per = 1<<40, 24*time.Hour }), funnel.ErrInvalidRule, withRules},
		{"Capacity*Per wraps to 0", lim, "k", 1, rule(func(r *funnel.Rule) { r.Capacity, r.Per = 1<<40, (1<<24)*time.Microsecond }), funnel.ErrInvalidRule, withRules},
		{"Capacity*Per just over 2^61", lim, "k", 1, rule(func(r *funnel.Rule) { r.Capacity, r.Per = 1<<61+1, time.Microsecond }), funnel.ErrInvalidRule, withRules},
		{"Leak 1<<62", lim, "k", 1, rule(func(r *funnel.Rule) { r.Leak = 1 << 62 }), funnel.ErrInvalidRule, withRules},
		{"second rule bad", lim, "k", 1, []funnel.Rule{good, {Name: "x", Capacity: 1, Leak: 0, Per: time.Second}}, funnel.ErrInvalidRule, withRules},
		{"duplicate rule names", lim, "k", 1, []funnel.Rule{good, {Name: "r", Capacity: 5, Leak: 1, Per: time.Hour}}, funnel.ErrInvalidRule, withRules},
		{"n 0", lim, "k", 0, []funnel.Rule{good}, funnel.ErrInvalidN, []entry{allowN, refund}},
		{"n -1", lim, "k", -1, []funnel.Rule{good}, funnel.ErrInvalidN, []entry{allowN, refund}},
		{"n > Capacity", lim, "k", 3, []funnel.Rule{good}, funnel.ErrInvalidN, []entry{allowN}},
		{"n > Capacity of the second rule", lim, "k", 2, []funnel.Rule{good, funnel.AtMost(1, time.Minute)}, funnel.ErrInvalidN, []entry{allowN}},
		{"nil Limiter", nil, "k", 1, []funnel.Rule{good}, funnel.ErrInvalidOption, all},
	}
	for _, tc := range cases {
		for _, e := range tc.entries {
			err := func() (err error) {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				return e.call(tc.lim, tc.key, tc.n, tc.rules)
			}()
			if !errors.Is(err, tc.want) {
				t.Errorf("%s: %s = %.200v, want %v", tc.desc, e.name, err, tc.want)
			} else if strings.Contains(err.Error(), "ERR") {
				t.Errorf("%s: %s = %.200v, a Redis error", tc.desc, e.name, err)
			}
		}
	}
	if keys := b.Mini.Keys(); len(keys) != 0 {
		t.Fatalf("bad input wrote %q", keys)
	}

	// Refund of more than the capacity is valid (never below empty), and
	// of an empty funnel writes nothing.
	if err := lim.Refund(ctx, "k", 1<<62, good); err != nil {
		t.Fatalf("Refund(2^62) = %v", err)
	}
	if keys := testutil.WithoutRecords(b.Mini.Keys()); len(keys) != 0 {
		t.Fatalf("a refund of an empty funnel wrote %q (besides its lock's release record)", keys)
	}

	// Odd keys are data: each gets a bucket of its own, under the prefix.
	odd := []string{
		"{", "}", "{}", "}{", "{k}", "k", "a{b}c", "{a}{b}", "~", "~0", "~1", "~2", "~{",
		"a\x00b", "a\x00c", "\x00", "\r\n", "PING\r\n*1\r\n$4\r\nPING\r\n", "k\n",
		"*", "?", "[a-z]", "k*", "\\", "\\*",
		"') redis.call('FLUSHALL') --", "]]..redis.call('DEL', KEYS[1])..[[", "%s%d", "\xff\xfe",
		strings.Repeat("x", funnel.MaxKeyLen), strings.Repeat("{", funnel.MaxKeyLen),
	}
	one := funnel.AtMost(1, time.Hour)
	for _, key := range odd {
		if res, err := lim.Allow(ctx, key, one); err != nil || !res.Allowed {
			t.Fatalf("first Allow(%.40q) = %+v, %v: want allowed, a bucket of its own", key, res, err)
		}
	}
	for _, key := range odd {
		if res, err := lim.Allow(ctx, key, one); err != nil || res.Allowed {
			t.Fatalf("second Allow(%.40q) = %+v, %v: want denied", key, res, err)
		}
	}
	keys := b.Mini.Keys()
	for _, k := range keys {
		if !strings.HasPrefix(k, b.Prefix) {
			t.Errorf("key %.60q outside the prefix %q", k, b.Prefix)
		}
	}
	if keys := testutil.WithoutRecords(keys); len(keys) != len(odd) {
		t.Fatalf("%d keys for %d odd keys, want one state key each (and release records)", len(keys), len(odd))
	}
}

// Regressions: n*Per overflowing int64 was admitted and took nothing; a typed
// nil client panicked; a non-hash state key gave a raw Redis error.
func TestBadInputRegressions(t *testing.T) {
	b := testutil.Mini(t)
	ctx := context.Background()
	lim := newLimiter(t, b)
	for _, per := range []time.Duration{4 * time.Microsecond, 24 * time.Hour} {
		rule := funnel.Rule{Name: "r", Capacity: 2, Leak: 1, Per: per}
		if _, err := lim.AllowN(ctx, "k", 1<<62, rule); !errors.Is(err, funnel.ErrInvalidN) {
			t.Errorf("AllowN(1<<62) with Per %v = %v, want ErrInvalidN", per, err)
		}
	}
	var nilClient *redis.Client
	if typed, err := funnel.New(nilClient); !errors.Is(err, funnel.ErrInvalidOption) || typed != nil {
		t.Errorf("New with a typed nil client = %v, %v; want nil, ErrInvalidOption", typed, err)
	}
	rule := funnel.AtMost(1, time.Minute)
	c := b.Client(t)
	c.Set(ctx, b.Prefix+"{str}:f", "not a hash", 0)
	if _, err := lim.Allow(ctx, "str", rule); !errors.Is(err, funnel.ErrCorruptState) {
		t.Errorf("Allow on a string key = %v, want ErrCorruptState", err)
	}
	if _, err := lim.Peek(ctx, "str", rule); !errors.Is(err, funnel.ErrCorruptState) {
		t.Errorf("Peek on a string key = %v, want ErrCorruptState", err)
	}
	for _, v := range []string{"garbage", "1:60000000:-5"} {
		c.HSet(ctx, b.Prefix+"{bad}:f", funnel.StateField(rule), v)
		if _, err := lim.Allow(ctx, "bad", rule); !errors.Is(err, funnel.ErrCorruptState) {
			t.Errorf("Allow on the field value %q = %v, want ErrCorruptState", v, err)
		}
	}
}
