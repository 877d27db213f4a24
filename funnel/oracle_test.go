package funnel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/funnelmodel"
)

// The oracle tests play random schedules on miniredis, whose clock they set
// before every call, and check every decision against an exact model in
// rationals (internal/funnelmodel) or the bound AtMost promises; the
// reliability suite checks them against redis_rate (GCRA) too.

// newRefKey is the model of rules, each of its kind.
func newRefKey(rules []funnel.Rule) funnelmodel.Key {
	return funnelmodel.NewKey(rules, func(r funnel.Rule) funnelmodel.Kind {
		zone, month, _ := funnel.Calendar(r)
		return funnelmodel.Kind{Window: funnel.IsWindow(r), Zone: zone, Month: month}
	})
}

// TestOracleReferenceModel checks every decision of random schedules over 1
// to 4 rules per key against the exact model: the decision (all or nothing),
// RetryAfter (the exact wait rounded up to the µs), the denying rule,
// Remaining, Tightest and ResetAfter. The schedules come back exactly when a
// denial said, and 1µs before.
func TestOracleReferenceModel(t *testing.T) {
	o := funnelmodel.NewOracle(t, "./funnel/")
	ctx := context.Background()
	const keys, steps = 14, 85
	var calls, denied, several, atRetry int
	for k := range keys {
		rules := make([]funnel.Rule, 1+o.Rng.IntN(4))
		names := map[string]bool{}
		least := int64(1 << 62)
		for i := range rules {
			name := o.Name()
			for names[name] {
				name = o.Name()
			}
			names[name] = true
			rules[i] = o.Rule(name)
			least = min(least, rules[i].Capacity)
		}
		key := fmt.Sprintf("k%d", k)
		model := newRefKey(rules)
		var now, n, retry int64 // retry: after the last call, if denied
		for i := range steps {
			switch p := o.Rng.IntN(10); {
			case retry > 0 && p < 3: // the same call, when it should be admitted
				now += retry
				atRetry++
			case retry > 1 && p < 5: // the same call, 1µs too early
				now += retry - 1
				atRetry++
			default:
				now += o.Gap(rules[o.Rng.IntN(len(rules))])
				n = o.N(least)
			}
			o.At(now)
			res, err := o.Lim.AllowN(ctx, key, n, rules...)
			if err != nil {
				t.Fatalf("key %d step %d: %v", k, i, err)
			}
			calls++
			where := fmt.Sprintf("rules %+v, step %d at +%dµs, n=%d", rules, i, now, n)
			retry = checkModel(t, where, rules, model, now, n, res, true)
			if !res.Allowed {
				denied++
				if len(rules) > 1 {
					several++
				}
			}
		}
	}
	if denied == 0 || denied == calls || several == 0 {
		t.Fatalf("%d of %d calls denied (%d over several rules): the schedules test nothing", denied, calls, several)
	}
	t.Logf("%d calls agreed (%d denied, %d over several rules; %d at or 1µs before a retry time)", calls, denied, several, atRetry)
}

// ruleIndex returns the index of the rule named name, or -1.
func ruleIndex(rules []funnel.Rule, name string) int {
	for i, r := range rules {
		if r.Name == name {
			return i
		}
	}
	return -1
}

// TestAtMostBruteForce plays adversarial schedules against AtMost(n, w) and
// checks by brute force that no window [t, t+w) holds more than n admitted
// units; also that the burst is n, that a denial's RetryAfter is exactly when
// the same call is admitted again, and the cooldown's ends.
func TestAtMostBruteForce(t *testing.T) {
	o := funnelmodel.NewOracle(t, "./funnel/")
	ctx := context.Background()

	cooldown := funnel.AtMost(1, time.Minute)
	for _, s := range []struct {
		at      time.Duration
		allowed bool
	}{{0, true}, {time.Minute - time.Microsecond, false}, {time.Minute, true}} {
		o.At(s.at.Microseconds())
		if res, err := o.Lim.Allow(ctx, "cooldown", cooldown); err != nil || res.Allowed != s.allowed {
			t.Fatalf("AtMost(1, 1m) at +%v: %+v, %v; want allowed=%v", s.at, res, err, s.allowed)
		}
	}

	windows := []time.Duration{
		time.Microsecond, 7 * time.Microsecond, 999_999 * time.Microsecond, time.Minute, 13*time.Hour + time.Microsecond,
	}
	var calls, admitted int
	for n := int64(1); n <= 6; n++ {
		for _, w := range windows {
			rule := funnel.AtMost(n, w)
			key := fmt.Sprintf("%d/%v", n, w)
			call := func(at, k int64) funnel.Result {
				t.Helper()
				o.At(at)
				res, err := o.Lim.AllowN(ctx, key, k, rule)
				if err != nil {
					t.Fatalf("AtMost(%d, %v) at +%dµs, %d units: %v", n, w, at, k, err)
				}
				calls++
				return res
			}

			// The largest burst: n units at one instant, then one a window.
			for i := range n {
				if res := call(0, 1); !res.Allowed {
					t.Fatalf("AtMost(%d, %v): call %d of a burst denied: %+v", n, w, i+1, res)
				}
			}
			if res := call(0, 1); res.Allowed || res.RetryAfter != w {
				t.Fatalf("AtMost(%d, %v): call %d of a burst: %+v, want denied for %v", n, w, n+1, res, w)
			}
			times := make([]int64, n) // of admitted units, in order

			// An adversary: mostly exactly when the last denial said, or one
			// window after a recent admission, or 1µs less; sometimes at the
			// same instant, 1µs later, or any time within a window.
			wu := w.Microseconds()
			now := int64(0)
			var deny struct{ k, at int64 } // the last denial, until an admission
			for range 65 {
				k := int64(1)
				if o.Rng.IntN(5) == 0 {
					k = 1 + o.Rng.Int64N(n)
				}
				switch p := o.Rng.IntN(10); {
				case deny.k > 0 && p < 4:
					now, k = deny.at, deny.k
				case p < 7:
					next := times[max(len(times)-1-o.Rng.IntN(int(n)+1), 0)] + wu
					if o.Rng.IntN(2) == 0 {
						next--
					}
					now = max(now, next)
				case p < 8:
					now++
				case p < 9:
					now += 1 + o.Rng.Int64N(wu)
				}
				res := call(now, k)
				if deny.k == k && res.Allowed != (now >= deny.at) {
					t.Fatalf("AtMost(%d, %v) at +%dµs, %d units: allowed=%v, but a denial said from +%dµs", n, w, now, k, res.Allowed, deny.at)
				}
				if !res.Allowed {
					if res.RetryAfter <= 0 || res.RetryAfter%time.Microsecond != 0 {
						t.Fatalf("AtMost(%d, %v) at +%dµs: denied with RetryAfter %v", n, w, now, res.RetryAfter)
					}
					deny.k, deny.at = k, now+res.RetryAfter.Microseconds()
					continue
				}
				deny.k = 0
				admitted++
				for range k {
					times = append(times, now)
				}
			}

			// Brute force; a window holding the most units starts at one.
			for i, start := range times {
				in := 0
				for _, at := range times[i:] {
					if at < start+wu {
						in++
					}
				}
				if int64(in) > n {
					t.Fatalf("AtMost(%d, %v): %d units in [+%dµs, +%dµs): %v", n, w, in, start, start+wu, times)
				}
			}
		}
	}
	t.Logf("%d calls, %d admitted after the bursts", calls, admitted)
}
