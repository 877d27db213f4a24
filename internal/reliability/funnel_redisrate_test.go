package reliability

import (
	"context"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/funnelmodel"
	"github.com/go-redis/redis_rate/v10"
)

// TestOracleRedisRate compares the funnel's decisions with redis_rate's, on
// the same miniredis at the same times: a funnel of capacity C leaking R per
// P decides like redis_rate.Limit{Burst: C, Rate: R, Period: P}.
//
// redis_rate computes in float seconds since 2017, so near a boundary it may
// go either way: its stored time drifts from the exact one by up to ~0.06µs
// per admission while its funnel is not empty. The test reads that stored
// time after every admission, and does not make a call that the exact model
// puts within 1µs plus that drift of a boundary; it counts them. Exact
// boundaries are for funnel's TestOracleReferenceModel; this one is here, not
// in funnel's tests, so that the library's module does not require redis_rate.
func TestOracleRedisRate(t *testing.T) {
	o := funnelmodel.NewOracle(t, "github.com/funnelguard/funnelguard/internal/reliability")
	ctx := context.Background()
	client := o.B.Client(t)
	peer := redis_rate.NewLimiter(client)
	// redis_rate's time 0, in µs after t0.
	origin := new(big.Rat).SetInt64(time.Date(2017, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro() - o.T0.UnixMicro())
	const rules, steps = 6, 150
	var calls, denied, skipped int
	maxDrift := new(big.Rat)
	for k := range rules {
		rule := o.Rule("r")
		limit := redis_rate.Limit{Burst: int(rule.Capacity), Rate: int(rule.Leak), Period: rule.Per}
		key := fmt.Sprintf("k%d", k)
		model := funnelmodel.NewRule(rule, funnelmodel.Kind{})
		var now int64
		drift := new(big.Rat) // of redis_rate's stored time, in µs
		for i := range steps {
			now += o.Gap(rule)
			n := o.N(rule.Capacity)
			where := fmt.Sprintf("rule %+v, step %d at +%dµs, n=%d", rule, i, now, n)
			slack := model.Slack(now, n)
			dist := new(big.Rat).Quo(new(big.Rat).Abs(slack), model.Rate)
			if dist.Cmp(new(big.Rat).Add(drift, big.NewRat(1, 1))) <= 0 {
				skipped++
				continue
			}
			want := slack.Sign() >= 0
			o.At(now)
			got, err := o.Lim.AllowN(ctx, key, n, rule)
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
				off := time.Duration(funnelmodel.RatCeil(drift)+1) * time.Microsecond
				if d := got.RetryAfter - rr.RetryAfter; d < -off || d > off+time.Microsecond {
					t.Fatalf("%s: funnel RetryAfter %v, redis_rate %v (drift %sµs)", where, got.RetryAfter, rr.RetryAfter, drift.FloatString(3))
				}
				continue
			}
			model.Take(now, n)
			// redis_rate stores when its funnel is empty, in seconds.
			tat, err := client.Get(ctx, "rate:"+key).Float64()
			if err != nil {
				t.Fatalf("%s: redis_rate's state: %v", where, err)
			}
			exact := new(big.Rat).Quo(model.Level, model.Rate)
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
