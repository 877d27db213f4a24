package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/go-redis/redis_rate/v10"
)

// Library names of the rate cases.
const (
	libFunnel    = "funnelguard"
	libRedisRate = "redis_rate"
)

// The SMS rules of the design, and the redis_rate limits that make the same
// decisions (Burst: Capacity, Rate: Leak, Period: Per).
var (
	oneRule    = []funnel.Rule{funnel.AtMost(5, time.Hour)}
	threeRules = []funnel.Rule{funnel.AtMost(1, time.Minute), funnel.AtMost(5, time.Hour), funnel.AtMost(10, 24*time.Hour)}
	// oneWindow is oneRule's bound as a sliding window (issue 29).
	oneWindow = []funnel.Rule{funnel.Window(5, time.Hour)}
)

// rateLimits converts rules to redis_rate limits.
func rateLimits(rules []funnel.Rule) []redis_rate.Limit {
	out := make([]redis_rate.Limit, len(rules))
	for i, r := range rules {
		out[i] = redis_rate.Limit{Rate: int(r.Leak), Burst: int(r.Capacity), Period: r.Per}
	}
	return out
}

// rateCases: admissions on distinct keys (serial and parallel) and denials
// on one flooded key (parallel), with 1 and 3 rules. redis_rate makes one
// AllowN call (one round trip) per rule, on a key per rule, as a caller with
// several rules must.
func rateCases() []benchCase {
	var out []benchCase
	for _, rs := range []struct {
		name  string
		rules []funnel.Rule
	}{{"1 rule", oneRule}, {"3 rules", threeRules}} {
		serial := []subject{{libFunnel, funnelAdmitted(rs.rules, false)}, {libRedisRate, rateAdmitted(rs.rules, false)}}
		parallel := []subject{{libFunnel, funnelAdmitted(rs.rules, true)}, {libRedisRate, rateAdmitted(rs.rules, true)}}
		if len(rs.rules) == 1 {
			// The library called as its benchmarks call it, with
			// context.Background()'s kind of context: no hand-off; and the
			// fresh-key path's commands in one script with no library; and
			// redis_rate sent as funnelguard sends a call that can be
			// cancelled (handedoff.go).
			serial = append(serial, subject{libFloor, floorAdmitted}, subject{libNoDeadline, funnelAdmittedNoDeadline(rs.rules)},
				subject{libFreshFloor, floorFreshAdmitted(false)},
				subject{handedOffName(libRedisRate), handedOff(rateAdmitted(rs.rules, false))})
			parallel = append(parallel, subject{libFreshFloor, floorFreshAdmitted(true)})
		}
		out = append(out,
			benchCase{name: "Allow admitted serial, " + rs.name, turns: true, subjects: serial},
			benchCase{name: "Allow admitted parallel, " + rs.name, parallel: true, turns: true, subjects: parallel,
				serverCmds: len(rs.rules) == 1, ref: libRedisRate},
			benchCase{name: "Allow denied parallel, " + rs.name, parallel: true, subjects: []subject{
				{libFunnel, funnelDenied(rs.rules)}, {libRedisRate, rateDenied(rs.rules)}}},
		)
	}
	out = append(out, returningCase(), peersCase())
	// 3 rules over 1, each a subject of one case so that they alternate
	// (between separate cases the VM's drift is in the ratio).
	for _, m := range []struct {
		mode string
		mk   func([]funnel.Rule) func(context.Context, *env) (workload, error)
	}{
		{"admitted parallel", func(r []funnel.Rule) func(context.Context, *env) (workload, error) { return funnelAdmitted(r, true) }},
		{"denied parallel", func(r []funnel.Rule) func(context.Context, *env) (workload, error) { return funnelDenied(r) }},
	} {
		out = append(out, benchCase{name: "funnelguard " + m.mode + ", 1 rule vs 3", parallel: true, subjects: []subject{
			{libOneRule, m.mk(oneRule)}, {libThreeRules, m.mk(threeRules)}}})
	}
	// A window rule: alone (as the 1 rule cases), and alternating with the
	// funnel rule, whose ratio is the target (>= 0.9).
	out = append(out,
		benchCase{name: "Allow admitted parallel, 1 window rule", parallel: true, subjects: []subject{{libFunnel, funnelAdmitted(oneWindow, true)}}},
		benchCase{name: "funnelguard admitted parallel, 1 rule vs 1 window rule", parallel: true, subjects: []subject{
			{libOneRule, funnelAdmitted(oneRule, true)}, {libOneWindow, funnelAdmitted(oneWindow, true)}}},
	)
	return out
}

// Column names of the 1 rule vs 3 rules (or 1 window rule) cases.
const (
	libOneRule    = "funnelguard, 1 rule"
	libThreeRules = "funnelguard, 3 rules"
	libOneWindow  = "funnelguard, 1 window rule"
)

// admittedKey is a key no call used before: goroutine g's i-th.
func admittedKey(g, i int) string {
	return "k" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
}

// funnelAdmitted: every call on a fresh key, so it is admitted by Allow's
// gate in one round trip (admit.lua).
func funnelAdmitted(rules []funnel.Rule, parallel bool) func(context.Context, *env) (workload, error) {
	return func(_ context.Context, e *env) (workload, error) {
		lim, err := funnel.New(e.client(), funnel.WithPrefix(e.prefix))
		if err != nil {
			return workload{}, err
		}
		return workload{goroutines: width(e, parallel), op: func(ctx context.Context, g, i int) error {
			res, err := lim.Allow(ctx, admittedKey(g, i), rules...)
			if err == nil && !res.Allowed {
				err = fmt.Errorf("fresh key denied: %+v", res)
			}
			return err
		}}, nil
	}
}

// funnelAdmittedNoDeadline is funnelAdmitted serial with a context that
// cannot end (context.WithoutCancel of the round's): the call runs in the
// caller's goroutine, as with context.Background().
func funnelAdmittedNoDeadline(rules []funnel.Rule) func(context.Context, *env) (workload, error) {
	admitted := funnelAdmitted(rules, false)
	return func(ctx context.Context, e *env) (workload, error) {
		w, err := admitted(ctx, e)
		op := w.op
		w.op = func(ctx context.Context, g, i int) error { return op(context.WithoutCancel(ctx), g, i) }
		return w, err
	}
}

// funnelDenied: every call on one key that is already full (1 round trip),
// on a Limiter with opts.
func funnelDenied(rules []funnel.Rule, opts ...funnel.Option) func(context.Context, *env) (workload, error) {
	return func(ctx context.Context, e *env) (workload, error) {
		lim, err := funnel.New(e.client(), append([]funnel.Option{funnel.WithPrefix(e.prefix)}, opts...)...)
		if err != nil {
			return workload{}, err
		}
		for {
			res, err := lim.Allow(ctx, "flood", rules...)
			if err != nil {
				return workload{}, err
			}
			if !res.Allowed {
				break
			}
		}
		return workload{goroutines: e.goroutines, op: func(ctx context.Context, _, _ int) error {
			res, err := lim.Allow(ctx, "flood", rules...)
			if err == nil && res.Allowed {
				err = fmt.Errorf("flooded key admitted: %+v", res)
			}
			return err
		}}, nil
	}
}

// rateAllow runs every limit on key (key+":"+rule index) and returns how
// many admitted.
func rateAllow(ctx context.Context, rl *redis_rate.Limiter, limits []redis_rate.Limit, key string) (int, error) {
	admitted := 0
	for i, l := range limits {
		k := key
		if len(limits) > 1 {
			k += ":" + strconv.Itoa(i)
		}
		res, err := rl.AllowN(ctx, k, l, 1)
		if err != nil {
			return 0, err
		}
		admitted += res.Allowed
	}
	return admitted, nil
}

// rateAdmitted is funnelAdmitted through redis_rate.
func rateAdmitted(rules []funnel.Rule, parallel bool) func(context.Context, *env) (workload, error) {
	limits := rateLimits(rules)
	return func(_ context.Context, e *env) (workload, error) {
		rl := redis_rate.NewLimiter(e.client())
		return workload{goroutines: width(e, parallel), op: func(ctx context.Context, g, i int) error {
			n, err := rateAllow(ctx, rl, limits, e.prefix+admittedKey(g, i))
			if err == nil && n != len(limits) {
				err = fmt.Errorf("fresh key: %d of %d limits admitted", n, len(limits))
			}
			return err
		}}, nil
	}
}

// rateDenied is funnelDenied through redis_rate: every limit's key flooded.
func rateDenied(rules []funnel.Rule) func(context.Context, *env) (workload, error) {
	limits := rateLimits(rules)
	return func(ctx context.Context, e *env) (workload, error) {
		rl := redis_rate.NewLimiter(e.client())
		key := e.prefix + "flood"
		for range 10 * len(limits) {
			if _, err := rateAllow(ctx, rl, limits, key); err != nil {
				return workload{}, err
			}
		}
		return workload{goroutines: e.goroutines, op: func(ctx context.Context, _, _ int) error {
			n, err := rateAllow(ctx, rl, limits, key)
			if err == nil && n != 0 {
				err = fmt.Errorf("flooded key: %d limits admitted", n)
			}
			return err
		}}, nil
	}
}
