package funnel_test

import (
	"context"
	"flag"
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/go-redis/redis_rate/v10"
)

// The oracle tests play random schedules on miniredis, whose clock they set
// before every call, and check every decision against redis_rate (GCRA), an
// exact model in rationals, or the bound AtMost promises.

var oracleSeed = flag.Uint64("oracle.seed", 0, "seed of the oracle tests' random schedules (0: a fresh one)")

// An oracle is the set-up of one test: a seeded generator, a miniredis and
// a Limiter on it, and the server time of a schedule's offset 0.
type oracle struct {
	rng *rand.Rand
	b   *testutil.Backend
	lim *funnel.Limiter
	t0  time.Time
}

// newOracle seeds its generator from -oracle.seed or at random, and logs the
// seed if t fails, so that any failure can be replayed.
func newOracle(t *testing.T) *oracle {
	t.Helper()
	seed := *oracleSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay with: go test -run '^%s$' ./funnel/ -oracle.seed=%d", t.Name(), seed)
		}
	})
	o := &oracle{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), b: testutil.Mini(t)}
	o.lim = newLimiter(t, o.b)
	o.t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(o.odd(1e12)) * time.Microsecond)
	return o
}

// at sets the server's clock to us µs after t0.
func (o *oracle) at(us int64) {
	o.b.Mini.SetTime(o.t0.Add(time.Duration(us) * time.Microsecond))
}

// odd returns a random odd number of µs in [1, 2*half-1].
func (o *oracle) odd(half int64) int64 {
	return 2*o.rng.Int64N(max(half, 1)) + 1
}

// rule returns a rule of Capacity 1..20, Leak 1..10 and a leak period that is
// round, or a random number of µs.
func (o *oracle) rule(name string) funnel.Rule {
	per := time.Duration(1+o.rng.Int64N(10_000_000)) * time.Microsecond
	switch o.rng.IntN(8) {
	case 0:
		per = time.Second
	case 1:
		per = 7 * time.Second
	case 2:
		per = time.Minute
	case 3:
		per = time.Hour
	case 4:
		per = 13 * time.Hour
	case 5:
		per = time.Duration(1+o.rng.Int64N(1000)) * time.Microsecond
	}
	return funnel.Rule{Name: name, Capacity: 1 + o.rng.Int64N(20), Leak: 1 + o.rng.Int64N(10), Per: per}
}

// name returns a short random rule name, some with braces and colons.
func (o *oracle) name() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789:/-_ {}"
	b := make([]byte, 1+o.rng.IntN(10))
	for i := range b {
		b[i] = letters[o.rng.IntN(len(letters))]
	}
	return string(b)
}

// n returns a call's units: often 1, else up to most.
func (o *oracle) n(most int64) int64 {
	if o.rng.IntN(2) == 0 {
		return 1
	}
	return 1 + o.rng.Int64N(most)
}

// gap returns a random time in µs to the next call on rule r: often none, so
// that calls pile up; else mostly odd numbers of µs, so that calls seldom
// fall on exact boundaries, around the time a unit takes to leak, and
// sometimes long enough to empty the funnel.
func (o *oracle) gap(r funnel.Rule) int64 {
	unit := max(r.Per.Microseconds()/r.Leak, 1)
	switch p := o.rng.IntN(20); {
	case p < 3:
		return 0
	case p < 8:
		return o.odd(unit / 8)
	case p < 18:
		return o.odd(unit)
	default:
		return o.odd(r.Capacity * unit)
	}
}

// TestOracleRedisRate compares the funnel's decisions with redis_rate's, on
// the same miniredis at the same times: a funnel of capacity C leaking R per
// P decides like redis_rate.Limit{Burst: C, Rate: R, Period: P}.
//
// redis_rate computes in float seconds since 2017, so near a boundary it may
// go either way: its stored time drifts from the exact one by up to ~0.06µs
// per admission while its funnel is not empty. The test reads that stored
// time after every admission, and does not make a call that the exact model
// puts within 1µs plus that drift of a boundary; it counts them. Exact
// boundaries are for TestOracleReferenceModel.
func TestOracleRedisRate(t *testing.T) {
	o := newOracle(t)
	ctx := context.Background()
	client := o.b.Client(t)
	peer := redis_rate.NewLimiter(client)
	// redis_rate's time 0, in µs after t0.
	origin := new(big.Rat).SetInt64(time.Date(2017, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro() - o.t0.UnixMicro())
	const rules, steps = 6, 150
	var calls, denied, skipped int
	maxDrift := new(big.Rat)
	for k := range rules {
		rule := o.rule("r")
		limit := redis_rate.Limit{Burst: int(rule.Capacity), Rate: int(rule.Leak), Period: rule.Per}
		key := fmt.Sprintf("k%d", k)
		model := newRefRule(rule)
		var now int64
		drift := new(big.Rat) // of redis_rate's stored time, in µs
		for i := range steps {
			now += o.gap(rule)
			n := o.n(rule.Capacity)
			where := fmt.Sprintf("rule %+v, step %d at +%dµs, n=%d", rule, i, now, n)
			slack := model.slack(now, n)
			dist := new(big.Rat).Quo(new(big.Rat).Abs(slack), model.rate)
			if dist.Cmp(new(big.Rat).Add(drift, big.NewRat(1, 1))) <= 0 {
				skipped++
				continue
			}
			want := slack.Sign() >= 0
			o.at(now)
			got, err := o.lim.AllowN(ctx, key, n, rule)
			if err != nil {
				t.Fatalf("%s: funnel: %v", where, err)
			}
			rr, err := peer.AllowN(ctx, key, limit, int(n))
			if err != nil {
				t.Fatalf("%s: redis_rate: %v", where, err)
			}
			calls++
			if got.Allowed != (rr.Allowed > 0) {
				t.Fatalf("%s: funnel allowed=%v (%+v), redis_rate allowed=%d (%+v); exact model: allowed=%v, %s units to spare",
					where, got.Allowed, got, rr.Allowed, rr, want, slack.FloatString(6))
			}
			if got.Allowed != want {
				t.Fatalf("%s: funnel and redis_rate allowed=%v, exact model: %v (%s units to spare)", where, got.Allowed, want, slack.FloatString(6))
			}
			if !got.Allowed {
				denied++
				// The funnel rounds the exact wait up to the µs; redis_rate's
				// drifts, and it truncates it to the ns.
				off := time.Duration(ratCeil(drift)+1) * time.Microsecond
				if d := got.RetryAfter - rr.RetryAfter; d < -off || d > off+time.Microsecond {
					t.Fatalf("%s: funnel RetryAfter %v, redis_rate %v (drift %sµs)", where, got.RetryAfter, rr.RetryAfter, drift.FloatString(3))
				}
				continue
			}
			model.take(now, n)
			// redis_rate stores when its funnel is empty, in seconds.
			tat, err := client.Get(ctx, "rate:"+key).Float64()
			if err != nil {
				t.Fatalf("%s: redis_rate's state: %v", where, err)
			}
			exact := new(big.Rat).Quo(model.level, model.rate)
			exact.Add(exact, new(big.Rat).SetInt64(now))
			drift.Mul(new(big.Rat).SetFloat64(tat), big.NewRat(1e6, 1))
			drift.Add(drift, origin).Sub(drift, exact).Abs(drift)
			if drift.Cmp(maxDrift) > 0 {
				maxDrift.Set(drift)
			}
		}
	}
	if denied == 0 || denied == calls {
		t.Fatalf("%d of %d calls denied: the schedules test nothing", denied, calls)
	}
	t.Logf("%d calls agreed (%d denied); %d calls near a boundary not made; redis_rate drifted up to %sµs",
		calls, denied, skipped, maxDrift.FloatString(3))
}

// TestOracleReferenceModel checks every decision of random schedules over 1
// to 4 rules per key against the exact model: the decision (all or nothing),
// RetryAfter (the exact wait rounded up to the µs), the denying rule,
// Remaining, Tightest and ResetAfter. The schedules come back exactly when a
// denial said, and 1µs before.
func TestOracleReferenceModel(t *testing.T) {
	o := newOracle(t)
	ctx := context.Background()
	const keys, steps = 14, 85
	var calls, denied, several, atRetry int
	for k := range keys {
		rules := make([]funnel.Rule, 1+o.rng.IntN(4))
		names := map[string]bool{}
		least := int64(1 << 62)
		for i := range rules {
			name := o.name()
			for names[name] {
				name = o.name()
			}
			names[name] = true
			rules[i] = o.rule(name)
			least = min(least, rules[i].Capacity)
		}
		key := fmt.Sprintf("k%d", k)
		model := newRefKey(rules)
		var now, n, retry int64 // retry: after the last call, if denied
		for i := range steps {
			switch p := o.rng.IntN(10); {
			case retry > 0 && p < 3: // the same call, when it should be admitted
				now += retry
				atRetry++
			case retry > 1 && p < 5: // the same call, 1µs too early
				now += retry - 1
				atRetry++
			default:
				now += o.gap(rules[o.rng.IntN(len(rules))])
				n = o.n(least)
			}
			o.at(now)
			res, err := o.lim.AllowN(ctx, key, n, rules...)
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
	o := newOracle(t)
	ctx := context.Background()

	cooldown := funnel.AtMost(1, time.Minute)
	for _, s := range []struct {
		at      time.Duration
		allowed bool
	}{{0, true}, {time.Minute - time.Microsecond, false}, {time.Minute, true}} {
		o.at(s.at.Microseconds())
		if res, err := o.lim.Allow(ctx, "cooldown", cooldown); err != nil || res.Allowed != s.allowed {
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
				o.at(at)
				res, err := o.lim.AllowN(ctx, key, k, rule)
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
				if o.rng.IntN(5) == 0 {
					k = 1 + o.rng.Int64N(n)
				}
				switch p := o.rng.IntN(10); {
				case deny.k > 0 && p < 4:
					now, k = deny.at, deny.k
				case p < 7:
					next := times[max(len(times)-1-o.rng.IntN(int(n)+1), 0)] + wu
					if o.rng.IntN(2) == 0 {
						next--
					}
					now = max(now, next)
				case p < 8:
					now++
				case p < 9:
					now += 1 + o.rng.Int64N(wu)
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
