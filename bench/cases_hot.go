package main

import (
	"cmp"
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
//
// The hot key again with 4 processes of goroutines/4 goroutines each (each
// process one Limiter, as a fleet of 4 instances has): the processes'
// admissions meet only in Redis. ops/s is the 4 processes' total.
func hotCases(goroutines int) []benchCase {
	return []benchCase{
		{name: "Allow denied parallel, flooded key, local cache", parallel: true, subjects: []subject{
			{libFunnel, funnelDenied(oneRule, funnel.WithDenyCache(10_000))}, {libRedisRate, rateDenied(oneRule)}}},
		{name: "Allow admitted parallel, one hot key", parallel: true, subjects: []subject{
			{libFunnel, funnelHot("")}, {libRedisRate, rateHot("")}}},
		{name: fmt.Sprintf("Allow admitted, one hot key, %d processes x %d", hotProcs, goroutines/hotProcs),
			parallel: true, procs: hotProcs, ref: libRedisRate,
			subjects: []subject{{lib: libFunnel}, {lib: libRedisRate}}},
	}
}

// hotProcs is the number of processes of the multi-process hot key case.
const hotProcs = 4

// workerSubject is what a worker process of the multi-process case runs:
// lib's hot key workload on the keys of the parent's prefix.
func workerSubject(lib, prefix string) (func(context.Context, *env) (workload, error), error) {
	switch lib {
	case libFunnel:
		return funnelHot(prefix), nil
	case libRedisRate:
		return rateHot(prefix), nil
	}
	return nil, fmt.Errorf("no worker subject %q", lib)
}

// funnelHot: every goroutine admits on one key with room for the run, the
// key under prefix ("": the round's own).
func funnelHot(prefix string) func(context.Context, *env) (workload, error) {
	return func(_ context.Context, e *env) (workload, error) {
		lim, err := funnel.New(e.client(), funnel.WithPrefix(cmp.Or(prefix, e.prefix)))
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
}

// rateHot is funnelHot through redis_rate.
func rateHot(prefix string) func(context.Context, *env) (workload, error) {
	return func(_ context.Context, e *env) (workload, error) {
		rl := redis_rate.NewLimiter(e.client())
		limit := rateLimits([]funnel.Rule{hotRule})[0]
		key := cmp.Or(prefix, e.prefix) + "hot"
		return workload{goroutines: e.goroutines, op: func(ctx context.Context, _, _ int) error {
			res, err := rl.AllowN(ctx, key, limit, 1)
			if err == nil && res.Allowed != 1 {
				err = fmt.Errorf("hot key denied: %+v", res)
			}
			return err
		}}, nil
	}
}
