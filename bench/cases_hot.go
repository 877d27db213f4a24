package main

import (
	"context"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/go-redis/redis_rate/v10"
)

// hotRule has room for every admission of a run on one key: 100 million
// units, leaking one an hour.
var hotRule = funnel.Rule{Name: "hot", Capacity: 100_000_000, Leak: 1, Per: time.Hour}

// hotCases: the two traffic patterns where a funnel key is hot. A flooded
// key (an attacker's), denied from the local deny cache (after the first
// denial, calls are denied in this process until the gate time: an hour's
// rule, the whole run); and one key that
// every admission of a fleet goes through (a global budget, a destination
// prefix, a tenant), admitted in batches that share a lock hold.
func hotCases() []benchCase {
	return []benchCase{
		{name: "Allow denied parallel, flooded key, local cache", parallel: true, subjects: []subject{
			{libFunnel, funnelDenied(oneRule, funnel.WithDenyCache(10_000))}, {libRedisRate, rateDenied(oneRule)}}},
		{name: "Allow admitted parallel, one hot key", parallel: true, subjects: []subject{
			{libFunnel, funnelHot}, {libRedisRate, rateHot}}},
	}
}

// funnelHot: every goroutine admits on one key with room for the run.
func funnelHot(_ context.Context, e *env) (workload, error) {
	lim, err := funnel.New(e.client(), funnel.WithPrefix(e.prefix))
	if err != nil {
		return workload{}, err
	}
	return workload{goroutines: e.goroutines, op: func(ctx context.Context, _, _ int) error {
		res, err := lim.Allow(ctx, "hot", hotRule)
		if err == nil && !res.Allowed {
			err = fmt.Errorf("hot key denied: %+v", res)
		}
		return err
	}}, nil
}

// rateHot is funnelHot through redis_rate.
func rateHot(_ context.Context, e *env) (workload, error) {
	rl := redis_rate.NewLimiter(e.client())
	limit := rateLimits([]funnel.Rule{hotRule})[0]
	key := e.prefix + "hot"
	return workload{goroutines: e.goroutines, op: func(ctx context.Context, _, _ int) error {
		res, err := rl.AllowN(ctx, key, limit, 1)
		if err == nil && res.Allowed != 1 {
			err = fmt.Errorf("hot key denied: %+v", res)
		}
		return err
	}}, nil
}
