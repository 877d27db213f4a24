package funnel_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	_ "time/tzdata" // the zones of the calendar tests, with Go alone

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/funnelmodel"
	"github.com/funnelguard/funnelguard/internal/keyspace"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// The window tests play random schedules of calls on keys with 1 to 4 rules
// mixing Window and funnel rules, and check every decision against the exact
// model (model_test.go: a sliding log of every unit for a window, rationals
// for a funnel): Allowed, RetryAfter, the denying rule, Remaining, Tightest
// and ResetAfter, on a Local and on a Limiter (miniredis, its clock set
// before every call).

// A windowTarget makes the calls of a schedule at µs now (from the
// schedule's start). peek and refund are nil where the target has none.
type windowTarget struct {
	allowN func(now int64, key string, n int64, rules []funnel.Rule) (funnel.Result, error)
	peek   func(now int64, key string, rules []funnel.Rule) (funnel.Result, error)
	refund func(now int64, key string, n int64, rules []funnel.Rule) error
	// asOfDenial: a denial's Rule, Remaining and Tightest may be those of
	// an earlier denial of fewer units, and its RetryAfter and ResetAfter
	// shorter than the model's (the deny cache's, see WithDenyCache).
	asOfDenial bool
	// base is the Unix time in µs of the schedule's time 0: calendar rules
	// count the days of it.
	base int64
}

// calendarRule returns a random PerDay or (rarely) PerMonth rule of 1 to 20
// units, in UTC, a zone with daylight saving time, or a fixed zone of a
// random offset (whose midnight falls anywhere in a schedule).
func calendarRule(rng *rand.Rand) funnel.Rule {
	var loc *time.Location
	switch rng.IntN(4) {
	case 0:
		loc = time.UTC
	case 1:
		loc = mustZone("America/New_York")
	default:
		off := rng.IntN(26*60+1) - 12*60 // minutes, -12:00 to +14:00
		loc = time.FixedZone(fmt.Sprintf("Z%+d", off), off*60)
	}
	n := 1 + rng.Int64N(20)
	if rng.IntN(8) == 0 {
		return funnel.PerMonth(n, loc)
	}
	return funnel.PerDay(n, loc)
}

// mustZone loads a zone of the tz database (time/tzdata is imported: the
// tests need only Go).
func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

// windowRules returns 1 to 4 rules mixing Window, calendar (PerDay,
// PerMonth) and funnel rules, the first a Window or a calendar rule, and
// the least capacity among them.
func windowRules(rng *rand.Rand) ([]funnel.Rule, int64) {
	rules := make([]funnel.Rule, 1+rng.IntN(4))
	names := map[string]bool{}
	least := int64(1 << 62)
	for i := range rules {
		for {
			per := time.Duration(1+rng.Int64N(10_000_000)) * time.Microsecond
			switch rng.IntN(6) {
			case 0:
				per = time.Second
			case 1:
				per = time.Minute
			case 2:
				per = 24 * time.Hour
			case 3:
				per = time.Duration(1+rng.Int64N(1000)) * time.Microsecond
			}
			switch k := rng.IntN(6); {
			case k < 2 || i == 0 && k < 4:
				rules[i] = funnel.Window(1+rng.Int64N(20), per)
			case k < 4:
				rules[i] = calendarRule(rng)
			default:
				rules[i] = funnel.Rule{Name: fmt.Sprintf("f%d", i), Capacity: 1 + rng.Int64N(20), Leak: 1 + rng.Int64N(10), Per: per}
			}
			if !names[rules[i].Name] {
				break
			}
		}
		names[rules[i].Name] = true
		least = min(least, rules[i].Capacity)
	}
	rng.Shuffle(len(rules), func(i, j int) { rules[i], rules[j] = rules[j], rules[i] })
	return rules, least
}

// windowGap returns a random time in µs to the next call: often none, else
// around the time of one unit of a rule, or of a whole window or funnel.
func windowGap(rng *rand.Rand, r funnel.Rule) int64 {
	unit := max(r.Per.Microseconds()/r.Leak, 1)
	odd := func(half int64) int64 { return 2*rng.Int64N(max(half, 1)) + 1 }
	switch p := rng.IntN(20); {
	case p < 4:
		return 0
	case p < 9:
		return odd(unit / 8)
	case p < 18:
		return odd(unit)
	default:
		return odd(r.Capacity * unit)
	}
}

// windowCounts counts what a schedule checked.
type windowCounts struct {
	calls, denied, several, atRetry, peeks, refunds int
	// calendar counts the calls with a calendar rule, byCalendar the
	// denials by one, and newPeriod the calls that found a calendar rule's
	// count of an earlier period (a reset).
	calendar, byCalendar, newPeriod int
}

// covered reports whether the schedules played test what they are for:
// denials and admissions, denials over several rules and by a calendar
// rule, calls in a calendar rule's new period, and calls without one.
func (c windowCounts) covered() bool {
	return c.denied > 0 && c.denied < c.calls && c.several > 0 && c.byCalendar > 0 && c.newPeriod > 0 && c.calendar < c.calls
}

// playWindow plays keys schedules of steps calls each on tg, and more (up
// to 3 times as many) while they do not yet test what they are for
// (covered: whether a seed's random rules ever deny by a calendar rule or
// reach its new period is chance), and checks every outcome against the
// model.
func playWindow(t *testing.T, rng *rand.Rand, tg windowTarget, keys, steps int) windowCounts {
	t.Helper()
	var c windowCounts
	for k := 0; k < keys || (k < 3*keys && !c.covered()); k++ {
		rules, least := windowRules(rng)
		key := fmt.Sprintf("w%d", k)
		model := newRefKey(rules).Since(tg.base)
		var now, n, retry int64
		for i := range steps {
			switch p := rng.IntN(10); {
			case retry > 0 && p < 3:
				now += retry
				c.atRetry++
			case retry > 1 && p < 5:
				now += retry - 1
				c.atRetry++
			default:
				now += windowGap(rng, rules[rng.IntN(len(rules))])
				n = 1
				if rng.IntN(2) == 0 {
					n = 1 + rng.Int64N(least)
				}
			}
			where := fmt.Sprintf("key %d (rules %+v), step %d at +%dµs, n=%d", k, rules, i, now, n)
			c.newPeriod += model.NewPeriods(now)
			if tg.peek != nil && rng.IntN(8) == 0 {
				res, err := tg.peek(now, key, rules)
				if err != nil {
					t.Fatalf("%s: peek: %v", where, err)
				}
				checkModel(t, where+" (peek)", rules, model, now, 1, res, false)
				c.peeks++
			}
			if tg.refund != nil && rng.IntN(12) == 0 {
				m := 1 + rng.Int64N(least)
				if err := tg.refund(now, key, m, rules); err != nil {
					t.Fatalf("%s: refund: %v", where, err)
				}
				model.Refund(now, m)
				c.refunds++
			}
			res, err := tg.allowN(now, key, n, rules)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			c.calls++
			if tg.asOfDenial && !res.Allowed && !model.Admits(now, n) {
				// A cached denial, perhaps of fewer units: its wait is
				// at most the model's; the rest is checked.
				_, least := model.Remaining(now)
				tight, _ := model.Tightest(now)
				res.Remaining, res.Tightest = least, rules[tight].Name
				waits, most := model.Waits(now, n)
				if res.RetryAfter <= 0 || res.RetryAfter > time.Duration(most)*time.Microsecond {
					t.Fatalf("%s: RetryAfter %v, model %dµs", where, res.RetryAfter, most)
				}
				res.RetryAfter, res.Rule = time.Duration(most)*time.Microsecond, rules[slices.Index(waits, most)].Name
				// As of the denial too: a smaller call admitted since
				// (not answered from the cache) makes it later.
				if reset := time.Duration(model.Reset(now)) * time.Microsecond; res.ResetAfter > reset {
					t.Fatalf("%s: ResetAfter %v, model %v", where, res.ResetAfter, reset)
				} else {
					res.ResetAfter = reset
				}
				if reset := time.Duration(model.Reset(now)) * time.Microsecond; res.TightestReset > reset {
					t.Fatalf("%s: TightestReset %v, past the model's ResetAfter %v", where, res.TightestReset, reset)
				}
				_, empty := model.Tightest(now)
				res.TightestReset = time.Duration(empty) * time.Microsecond
			}
			retry = checkModel(t, where, rules, model, now, n, res, true)
			calendar := slices.ContainsFunc(rules, isCalendar)
			if calendar {
				c.calendar++
			}
			if retry > 0 {
				c.denied++
				if len(rules) > 1 {
					c.several++
				}
				if isCalendar(rules[ruleIndex(rules, res.Rule)]) {
					c.byCalendar++
				}
			}
		}
	}
	if !c.covered() {
		t.Fatalf("%d of %d calls denied (%d over several rules, %d by a calendar rule; %d in a new period; %d with a calendar rule): the schedules test nothing", c.denied, c.calls, c.several, c.byCalendar, c.newPeriod, c.calendar)
	}
	return c
}

// isCalendar reports whether r is a PerDay or PerMonth rule.
func isCalendar(r funnel.Rule) bool {
	_, _, ok := funnel.Calendar(r)
	return ok
}

// gone accounts for a call that model admitted between before and after
// whose key had expired by read (server µs), when the test read it (a
// loaded machine paused the test past the key's short windows): the call's
// time cannot be told, so its units are taken at the earliest time in
// [before, after] that the model admits them (admission only grows with
// time: with the key gone, every later call finds the model empty too),
// and t fails if the key expired before even that admission's state could
// have emptied (1 ms for the expiry's rounding to ms).
func gone(t *testing.T, where string, model funnelmodel.Key, before, after, n, read int64) bool {
	t.Helper()
	if !model.Admits(after, n) {
		t.Fatalf("%s: admitted, the key gone when read, and the model admits it nowhere in [%d, %d]", where, before, after)
	}
	lo, hi := before, after // the earliest admitting time is in (lo, hi], or lo
	if model.Admits(lo, n) {
		hi = lo
	}
	for lo < hi-1 {
		if mid := lo + (hi-lo)/2; model.Admits(mid, n) {
			hi = mid
		} else {
			lo = mid
		}
	}
	model.Take(hi, n)
	if empty := hi + model.Reset(hi); read < empty-1000 {
		t.Fatalf("%s: the key expired by %d, before its state could empty (%d at the earliest)", where, read, empty)
	}
	return true
}

// checkModel checks res, the outcome of a call of n units at now (take:
// an AllowN, which the model then takes if admitted; else a Peek), against
// the model, and returns its exact wait (0: admitted): Allowed, RetryAfter,
// Rule, Remaining, Tightest (the fewest units left, then the last to be
// empty), ResetAfter and TightestReset, all exact to the µs.
func checkModel(t *testing.T, where string, rules []funnel.Rule, model funnelmodel.Key, now, n int64, res funnel.Result, take bool) int64 {
	t.Helper()
	want := model.Admits(now, n)
	if res.Allowed != want {
		t.Fatalf("%s: allowed=%v (%+v), model: %v", where, res.Allowed, res, want)
	}
	var most int64
	if want {
		if take {
			model.Take(now, n)
		}
		if res.Rule != "" || res.RetryAfter != 0 {
			t.Fatalf("%s: admitted with %+v", where, res)
		}
	} else {
		var waits []int64
		waits, most = model.Waits(now, n)
		if got := res.RetryAfter; got != time.Duration(most)*time.Microsecond {
			t.Fatalf("%s: RetryAfter %v, model %dµs (waits %v)", where, got, most, waits)
		}
		if !model.Admits(now+most, n) || model.Admits(now+most-1, n) {
			t.Fatalf("%s: RetryAfter %v, but the model admits first at another µs", where, res.RetryAfter)
		}
		if i := ruleIndex(rules, res.Rule); i < 0 || waits[i] != most {
			t.Fatalf("%s: denied by %q, but the longest waits (%dµs) are of %v (waits %v)", where, res.Rule, most, rules, waits)
		}
	}
	left, least := model.Remaining(now)
	if res.Remaining != least {
		t.Fatalf("%s: Remaining %d, model %d (%v)", where, res.Remaining, least, left)
	}
	tight, empty := model.Tightest(now)
	if res.Tightest != rules[tight].Name {
		t.Fatalf("%s: Tightest %q, but the fewest units left (%d), the last to be empty, are in %q (%v)", where, res.Tightest, least, rules[tight].Name, left)
	}
	if got, want := res.TightestReset, time.Duration(empty)*time.Microsecond; got != want {
		t.Fatalf("%s: TightestReset %v, model %v", where, got, want)
	}
	if got, want := res.ResetAfter, time.Duration(model.Reset(now))*time.Microsecond; got != want {
		t.Fatalf("%s: ResetAfter %v, model %v", where, got, want)
	}
	return most
}

func TestWindowLocalModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 1))
	l := funnel.NewLocal(0)
	// A wall time only, in whole µs, after the Local's creation: the Local
	// counts days of exactly this time plus the schedule's.
	base := time.Now().Truncate(time.Microsecond)
	tg := windowTarget{base: base.UnixMicro(), allowN: func(now int64, key string, n int64, rules []funnel.Rule) (funnel.Result, error) {
		return l.AllowN(base.Add(time.Duration(now)*time.Microsecond), key, n, rules...)
	}}
	c := playWindow(t, rng, tg, 200, 100)
	t.Logf("%+v", c)
}

// TestWindowOracle plays the schedules on miniredis, with each way a
// Limiter can decide: the one-round-trip admission (admit.lua) and the
// batcher by default, read.lua (WithUniformCost), alone
// (WithoutBatching), and with the deny cache on the server's clock.
func TestWindowOracle(t *testing.T) {
	for _, v := range []string{"default", "uniform", "alone", "denycache"} {
		t.Run(v, func(t *testing.T) {
			o := funnelmodel.NewOracle(t, "./funnel/")
			// In a synctest bubble (its server outside): the deny cache's
			// clock moves with the server's, by sleeps.
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				var tg windowTarget
				switch v {
				case "uniform":
					o.Lim = newLimiter(t, o.B, funnel.WithUniformCost())
				case "alone":
					o.Lim = newLimiter(t, o.B, funnel.WithoutBatching())
				default:
					o.Lim = newLimiter(t, o.B)
				case "denycache":
					o.Lim = newLimiter(t, o.B, funnel.WithDenyCache(100))
				}
				tg.asOfDenial = v == "denycache"
				// Each key's schedule starts over at 0; the bubble's clock
				// only moves on: shift keeps it monotonic, each key's
				// durations as they are.
				c0, shift, last := time.Now(), int64(0), int64(0)
				at := func(now int64) {
					o.At(now)
					if now < last {
						shift += last - now
					}
					last = now
					sleepTo(c0, time.Duration(shift+now)*time.Microsecond)
				}
				tg = windowTarget{
					asOfDenial: tg.asOfDenial,
					base:       o.T0.UnixMicro(),
					allowN: func(now int64, key string, n int64, rules []funnel.Rule) (funnel.Result, error) {
						at(now)
						return o.Lim.AllowN(ctx, key, n, rules...)
					},
					peek: func(now int64, key string, rules []funnel.Rule) (funnel.Result, error) {
						at(now)
						return o.Lim.Peek(ctx, key, rules...)
					},
					refund: func(now int64, key string, n int64, rules []funnel.Rule) error {
						at(now)
						return o.Lim.Refund(ctx, key, n, rules...)
					},
				}
				c := playWindow(t, o.Rng, tg, 20, 100)
				t.Logf("%+v", c)
			})
		})
	}
}

// A window refuses more than MaxWindow units, and bad lengths.
func TestWindowInvalid(t *testing.T) {
	for _, r := range []funnel.Rule{
		funnel.Window(0, time.Second),
		funnel.Window(funnel.MaxWindow+1, time.Second),
		funnel.Window(1_000_000, time.Hour),
		funnel.Window(5, 0),
		funnel.Window(5, time.Nanosecond),
		funnel.Window(5, 1500*time.Nanosecond),
	} {
		if err := funnel.Validate(r); !errors.Is(err, funnel.ErrInvalidRule) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidRule", r, err)
		}
	}
	if err := funnel.Validate(funnel.Window(funnel.MaxWindow, 24*time.Hour), funnel.AtMost(5, time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := funnel.Validate(funnel.Window(5, time.Hour), funnel.AtMost(5, time.Hour)); err != nil {
		t.Fatalf("a window and AtMost of the same numbers: %v", err)
	}
	if r := funnel.Window(5, time.Hour); r.Name != "5 in 1h0m0s" || !strings.Contains(r.Name, "in") {
		t.Fatalf("name %q", r.Name)
	}
}

// On a real server the test cannot set the clock, so it recovers the exact
// server time of each call and checks the call there: an admission or a
// refund writes it as <at> in every field it keeps; a denial's RetryAfter is
// T - now, where T, the time its rule has room again, does not depend on
// when, before T, the call was made (the model gives T from a time read just
// before the call); and so for a Peek's ResetAfter. The time found must lie
// between the server's TIME before and after the call. The windows and
// funnels are short (1ms to 200ms) so that units leave them while the test
// runs, or long (a minute, a day). Calendar rules count the days of a
// fixed zone whose midnight falls within a second of each key's first
// call, so they change days while it runs. It also checks that the key's
// TTL is never past the last unit's departure (or the period's end; it
// may only grow), to the ms.
func TestWindowRealServer(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	c := b.Client(t)
	// Without the state cache: written reads a call's server time from the
	// state it wrote, and the returning key's gate anchors a funnel's new
	// level at an estimate of that time instead (see gate.go).
	lim := newLimiter(t, b, funnel.WithStateCache(0))
	seed := *funnelmodel.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay with -oracle.seed=%d", seed)
		}
	})
	rng := rand.New(rand.NewPCG(seed, 29))
	serverNow := func() int64 {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMicro()
	}
	// written returns the <at> of the fields of key's state (the time of
	// its last write), or 0 if it has none.
	written := func(key string) int64 {
		vals, err := c.HGetAll(ctx, keyspace.Key(b.Prefix, key, "f")).Result()
		if err != nil {
			t.Fatal(err)
		}
		var at int64
		for f, v := range vals {
			parts := strings.Split(v, ":")
			if len(parts) < 3 {
				t.Fatalf("field %q holds %q", f, v)
			}
			x, err := strconv.ParseInt(parts[2], 36, 64)
			if err != nil {
				t.Fatalf("field %q holds %q", f, v)
			}
			at = max(at, x)
		}
		return at
	}
	within := func(where string, now, before, after int64) {
		t.Helper()
		if now < before || now > after {
			t.Fatalf("%s: the call's server time %d is not within [%d, %d]", where, now, before, after)
		}
	}
	short := func() time.Duration { return time.Duration(1000+rng.Int64N(200_000)) * time.Microsecond }
	var calls, denied, peeks, refunds, several, byCalendar, newPeriod int
	// 8 keys, and more (up to 24) while the schedules so far test too
	// little: whether a call finds a calendar rule's new period depends on
	// the seed and on how long the calls take here (some seeds' calendar
	// rules hold no unit when their midnight passes).
	const keys, maxKeys, steps = 8, 24, 40
	covered := func() bool {
		return denied > 0 && denied < calls && several > 0 && byCalendar > 0 && newPeriod > 0
	}
	for k := 0; k < keys || (k < maxKeys && !covered()); k++ {
		// A fixed zone whose midnight falls within a second: the key's
		// calendar rules change days while the key's calls run.
		midnight := serverNow()/1e6 + 1
		zone := time.FixedZone(fmt.Sprintf("midnight+%d", k), -int(midnight%86400))
		rules := make([]funnel.Rule, 1+rng.IntN(4))
		least := int64(1 << 62)
		for i := range rules {
			per := short()
			switch rng.IntN(6) {
			case 0:
				per = time.Minute
			case 1:
				per = 24 * time.Hour
			}
			switch p := rng.IntN(6); {
			case p < 3 && (i == 0 || p < 2):
				rules[i] = funnel.Window(1+rng.Int64N(8), per)
				rules[i].Name = fmt.Sprintf("w%d", i)
			case p < 4:
				rules[i] = funnel.PerDay(1+rng.Int64N(8), zone)
				if rng.IntN(8) == 0 {
					rules[i] = funnel.PerMonth(1+rng.Int64N(8), zone)
				}
				rules[i].Name = fmt.Sprintf("c%d", i)
			default:
				rules[i] = funnel.Rule{Name: fmt.Sprintf("f%d", i), Capacity: 1 + rng.Int64N(8), Leak: 1 + rng.Int64N(3), Per: per}
			}
			least = min(least, rules[i].Capacity)
		}
		key := fmt.Sprintf("r%d", k)
		model := newRefKey(rules)
		var expiry int64 // when the key may expire at the latest (µs)
		for i := range steps {
			r := rules[rng.IntN(len(rules))]
			if rng.IntN(4) > 0 {
				time.Sleep(min(time.Duration(rng.Int64N(int64(r.Per/time.Duration(r.Leak))+1)), 60*time.Millisecond))
			}
			n := int64(1)
			if rng.IntN(2) == 0 {
				n = 1 + rng.Int64N(least)
			}
			where := fmt.Sprintf("key %d (rules %+v), step %d, n=%d", k, rules, i, n)
			if rng.IntN(6) == 0 {
				before := serverNow()
				res, err := lim.Peek(ctx, key, rules...)
				after := serverNow()
				if err != nil {
					t.Fatal(err)
				}
				if model.Straddles(before, after) {
					continue // its time cannot be told; the next call is checked
				}
				now := after
				switch {
				case !res.Allowed:
					j := ruleIndex(rules, res.Rule)
					waits, _ := model.Waits(before, 1)
					now = before + waits[j] - res.RetryAfter.Microseconds()
				case res.ResetAfter > 0:
					now = before + model.Reset(before) - res.ResetAfter.Microseconds()
				}
				within(where+" (peek)", now, before, after)
				checkModel(t, where+" (peek)", rules, model, now, 1, res, false)
				peeks++
			}
			if rng.IntN(10) == 0 {
				m := 1 + rng.Int64N(least)
				before := serverNow()
				if err := lim.Refund(ctx, key, m, rules...); err != nil {
					t.Fatal(err)
				}
				after := serverNow()
				now := written(key)
				if now == 0 || now < before { // nothing kept: as empty at after
					now = after
				}
				within(where+" (refund)", now, before, after)
				model.Refund(now, m)
				expiry = max(expiry, after+model.Reset(now)) // see below
				refunds++
			}
			before := serverNow()
			newPeriod += model.NewPeriods(before)
			res, err := lim.AllowN(ctx, key, n, rules...)
			after := serverNow()
			if err != nil {
				t.Fatal(err)
			}
			var now int64
			if res.Allowed {
				if now = written(key); now == 0 && gone(t, where, model, before, after, n, serverNow()) {
					calls++
					continue
				}
			} else {
				j := ruleIndex(rules, res.Rule)
				if j < 0 {
					t.Fatalf("%s: denied by %q", where, res.Rule)
				}
				waits, _ := model.Waits(before, n)
				now = before + waits[j] - res.RetryAfter.Microseconds()
				denied++
				if len(rules) > 1 {
					several++
				}
				if isCalendar(rules[j]) {
					byCalendar++
				}
			}
			within(where, now, before, after)
			checkModel(t, where, rules, model, now, n, res, true)
			calls++
			if res.Allowed {
				// The TTL is computed from the read's time (now) and set
				// by the write, up to after - now later: an expiry that
				// late. (A calendar rule's end stays put while the key's
				// calls run, so an earlier write's lateness stays in the
				// TTL, which only grows.)
				expiry = max(expiry, after+model.Reset(now))
				pttl, err := c.PTTL(ctx, keyspace.Key(b.Prefix, key, "f")).Result()
				if err != nil {
					t.Fatal(err)
				}
				// 5ms more: the stored expiry comes from several ms
				// roundings (the rules' µs empty times cut to whole ms,
				// set against the server's ms clock, read back with PTTL
				// against it again, Valkey's ms clock up to 1ms ahead of
				// TIME), each up to 1ms; 2ms was once exceeded by 1ms in
				// CI. The decisions themselves are checked to the µs above:
				// this bounds only how long an idle key lives.
				// And a funnel's expiry rounds up to its grid.
				most := time.Duration(expiry-now+999)/1000*time.Millisecond + 5*time.Millisecond
				for _, r := range rules {
					most = max(most, time.Duration(expiry-now+999)/1000*time.Millisecond+funnel.Grid(r)+5*time.Millisecond)
				}
				if pttl == -2 { // gone: a loaded machine read it after its expiry
					if read, empty := serverNow(), now+model.Reset(now); read < empty-1000 {
						t.Fatalf("%s: the key expired by %d, before its state could empty (%d)", where, read, empty)
					}
					continue
				}
				if pttl <= 0 || pttl > most {
					t.Fatalf("%s: TTL %v, want at most %v", where, pttl, most)
				}
			}
		}
	}
	if !covered() {
		t.Fatalf("%d of %d calls denied (%d over several rules, %d by a calendar rule; %d in a new period): the schedules test nothing", denied, calls, several, byCalendar, newPeriod)
	}
	t.Logf("on %s: %d calls agreed (%d denied, %d over several rules, %d by a calendar rule; %d found a new period), %d peeks, %d refunds", testutil.ServerName(), calls, denied, several, byCalendar, newPeriod, peeks, refunds)
}

// The memory of an active key with one Window(n, w) (MEMORY USAGE, key
// included, on a real server with the default hash-max-listpack-value of
// 64): at most 16n + 100 bytes after n calls a few µs apart (Window(10,
// 24h): 152 bytes on Redis 7); at most 16n + 250 in the
// worst case, n units at distinct times spread over a day, where a value
// over 64 bytes makes the server store the hash as a table (about 150
// bytes more): the 16n + 100 then holds from n = 20 on only. It logs
// the figures.
func TestWindowMemory(t *testing.T) {
	b := testutil.RealBackend(t)
	ctx := context.Background()
	c := b.Client(t)
	lim := newLimiter(t, b)
	usage := func(key string) int64 {
		t.Helper()
		u, err := c.MemoryUsage(ctx, keyspace.Key(b.Prefix, key, "f")).Result()
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	r := funnel.Window(10, 24*time.Hour)
	for range 10 {
		if res, err := lim.Allow(ctx, "ten", r); err != nil || !res.Allowed {
			t.Fatalf("%+v, %v", res, err)
		}
	}
	if u := usage("ten"); u > 16*10+100 {
		t.Errorf("Window(10, 24h) after 10 calls: %d bytes, want at most %d", u, 16*10+100)
	} else {
		t.Logf("Window(10, 24h) after 10 calls: %d bytes (16n+100: %d)", u, 16*10+100)
	}
	for _, n := range []int64{1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 18, 20, 25, 30, 100, funnel.MaxWindow} {
		r := funnel.Window(n, 24*time.Hour)
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		at := now.UnixMicro()
		log := make([]int64, n)
		w := r.Per.Microseconds() - 1e6 // the oldest leaves a second after at: Peek still counts it
		for i := range log {            // distinct times over the whole day, the oldest first
			log[i] = at - w + int64(i)*w/n
		}
		key := fmt.Sprintf("full%d", n)
		field, value := funnel.WindowState(r, log, at)
		if err := c.HSet(ctx, keyspace.Key(b.Prefix, key, "f"), field, value).Err(); err != nil {
			t.Fatal(err)
		}
		res, err := lim.Peek(ctx, key, r)
		if err != nil || res.Allowed || res.Remaining != 0 {
			t.Fatalf("Window(%d, 24h) full: %+v, %v", n, res, err)
		}
		u := usage(key)
		if u > 16*n+250 {
			t.Errorf("Window(%d, 24h) full at distinct times: %d bytes, want at most %d", n, u, 16*n+250)
		}
		t.Logf("Window(%d, 24h) full at distinct times: %d bytes (16n+100: %d; value %d bytes)", n, u, 16*n+100, len(value))
	}
}

// A window in the penalty box: its denials count like a funnel's, the box
// denies past the window's own wait, and after the box the window decides
// again, exactly when its oldest unit leaves. Reset forgets both.
func TestWindowPenalty(t *testing.T) {
	b := testutil.Mini(t)
	start := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	b.Mini.SetTime(start)
	ctx := context.Background()
	rule := funnel.Window(2, 30*time.Minute)
	lim := mustLimiter(t, b.Client(t), funnel.WithPrefix(b.Prefix), funnel.WithPenalty(funnel.Penalty{Denials: 3, Within: time.Minute, For: 40 * time.Minute}))
	allow := func(at time.Duration) funnel.Result {
		t.Helper()
		b.Mini.SetTime(start.Add(at))
		res, err := lim.Allow(ctx, "k", rule)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for i, at := range []time.Duration{0, time.Second} {
		if res := allow(at); !res.Allowed {
			t.Fatalf("call %d: %+v", i, res)
		}
	}
	for i := range 2 {
		if res := allow(2 * time.Second); res.Allowed || res.Rule != rule.Name || res.RetryAfter != 30*time.Minute-2*time.Second {
			t.Fatalf("denial %d: %+v; want the window's, until its oldest unit leaves", i, res)
		}
	}
	if res := allow(2 * time.Second); res.Rule != funnel.PenaltyRule || res.RetryAfter != 40*time.Minute {
		t.Fatalf("third denial: %+v; want the box for 40m", res)
	}
	if res := allow(31 * time.Minute); res.Rule != funnel.PenaltyRule || res.RetryAfter != 40*time.Minute+2*time.Second-31*time.Minute {
		t.Fatalf("after the window emptied, in the box: %+v", res)
	}
	if res := allow(40*time.Minute + 2*time.Second); !res.Allowed || res.Remaining != 1 {
		t.Fatalf("after the box: %+v; want admitted with 1 left", res)
	}
	if err := lim.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if res, err := lim.Peek(ctx, "k", rule); err != nil || !res.Allowed || res.Remaining != 2 {
		t.Fatalf("after Reset: %+v, %v", res, err)
	}
}

// Concurrent calls on one key, batched: a window admits exactly n of them
// while its units stay in it, and its field holds n units.
func TestWindowConcurrent(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		raceToLimit(t, b, []funnel.Rule{funnel.Window(37, time.Hour), {Name: "f", Capacity: 100, Leak: 1, Per: time.Hour}})
	})
}

// A window's field that does not hold a window's units is corrupt state,
// not a panic or an allocation of its claimed size.
func TestWindowCorruptState(t *testing.T) {
	b := testutil.Mini(t)
	ctx := context.Background()
	c := b.Client(t)
	lim := newLimiter(t, b)
	r := funnel.Window(5, time.Hour)
	field, _ := funnel.WindowState(r, []int64{1}, 2)
	for _, v := range []string{"", "0", "0::5", "0:1,2:5", "0:0*0:5", "0:0*6:5", "0:0*zzzzzzzzzz:5", "0:6:5", "0:-1:5", "0:1;2:5", "0:1:5:n:x", "0:1,1,1,1,1,1:9"} {
		if err := c.HSet(ctx, keyspace.Key(b.Prefix, "k", "f"), field, v).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := lim.Allow(ctx, "k", r); !errors.Is(err, funnel.ErrCorruptState) {
			t.Errorf("value %q: %v, want ErrCorruptState", v, err)
		}
	}
}

// raceToLimit makes 160 calls of rules on one key from 16 goroutines, whose
// first rule admits 37: exactly 37 are admitted, and Peek then names that
// rule, with nothing left.
func raceToLimit(t *testing.T, b *testutil.Backend, rules []funnel.Rule) {
	t.Helper()
	ctx := context.Background()
	lim := newLimiter(t, b)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 10 {
				res, err := lim.Allow(ctx, "hot", rules...)
				if err != nil {
					t.Error(err)
					return
				}
				if res.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 37 {
		t.Fatalf("%d admitted, want 37", n)
	}
	if res, err := lim.Peek(ctx, "hot", rules...); err != nil || res.Allowed || res.Remaining != 0 || res.Rule != rules[0].Name {
		t.Fatalf("Peek %+v, %v", res, err)
	}
}
