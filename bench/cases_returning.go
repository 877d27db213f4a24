package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/go-redis/redis_rate/v10"
)

// returningRule admits every call of a run on a key that comes back: a
// burst of 100,000, then 1000 an hour. Its state lives 3.6 s per admission
// (the time one unit takes to leak out), longer than a key of the pool
// stays away, so that every call finds its key's state: with a fast rule
// (say 1000 a second) the state would be gone, its TTL 1 ms, before the
// key came back, and the case would measure fresh keys again.
var returningRule = funnel.Rule{Name: "returning", Capacity: 100_000, Leak: 1000, Per: time.Hour}

// returningKeys is the size of the pool of keys the case cycles through,
// round-robin: at the 12,000-60,000 admissions a second measured here, each
// key comes back every 70-340 ms, 3-15 times a second (the traffic:
// "5 per second per key, 64 goroutines, keys reused"), and 3-45 times in a
// round of 1-3 s.
const returningKeys = 4096

// returningCase: Allow admitted parallel, 1 rule, on keys that come back.
// Every key is admitted once before the round is timed, so that every
// timed call is on a key with state. A denial fails the round.
func returningCase() benchCase {
	return benchCase{
		name: "Allow admitted parallel, 1 rule, returning keys", parallel: true, serverCmds: true, ref: libRedisRate, turns: true,
		subjects: []subject{{libFunnel, returning(funnelAdmitter(returningRule))}, {libRedisRate, returning(rateAdmitter(returningRule))}},
	}
}

// An admitter is one library's admission of one call on key (under the
// round's prefix), and the prefix its keys need (for libraries that do not
// take one).
type admitter struct {
	admit  func(ctx context.Context, key string) (bool, error)
	prefix string
}

// funnelAdmitter admits through a funnel Limiter with rule.
func funnelAdmitter(rule funnel.Rule) func(*env) (admitter, error) {
	return func(e *env) (admitter, error) {
		lim, err := funnel.New(e.client(), funnel.WithPrefix(e.prefix))
		if err != nil {
			return admitter{}, err
		}
		return admitter{admit: func(ctx context.Context, key string) (bool, error) {
			res, err := lim.Allow(ctx, key, rule)
			return res.Allowed, err
		}}, nil
	}
}

// rateAdmitter admits through redis_rate with rule's limit (the same
// decisions: Burst Capacity, Rate Leak, Period Per).
func rateAdmitter(rule funnel.Rule) func(*env) (admitter, error) {
	return func(e *env) (admitter, error) {
		rl := redis_rate.NewLimiter(e.client())
		limit := rateLimits([]funnel.Rule{rule})[0]
		return admitter{prefix: e.prefix, admit: func(ctx context.Context, key string) (bool, error) {
			res, err := rl.AllowN(ctx, key, limit, 1)
			return err == nil && res.Allowed == 1, err
		}}, nil
	}
}

// returning is the returning keys workload on mk's admitter: the
// goroutines take the pool's keys in turn from one counter; the round
// fails if any call was denied.
func returning(mk func(*env) (admitter, error)) func(context.Context, *env) (workload, error) {
	return func(ctx context.Context, e *env) (workload, error) {
		a, err := mk(e)
		if err != nil {
			return workload{}, err
		}
		keys := make([]string, returningKeys)
		for i := range keys {
			keys[i] = a.prefix + "r" + strconv.Itoa(i)
		}
		if err := warm(ctx, a, keys); err != nil {
			return workload{}, err
		}
		key := func(i int64) string { return keys[i%returningKeys] }
		return admitEvery(e, a, key, false, "the rule must admit every call of the case"), nil
	}
}

// admitEvery is the workload of a that admits call i (from one counter) on
// key(i+1), with a context that cannot end if noDeadline; the round fails
// if any call is denied (why says what should have admitted it).
func admitEvery(e *env, a admitter, key func(i int64) string, noDeadline bool, why string) workload {
	var next, calls, denied atomic.Int64
	return workload{goroutines: e.goroutines,
		op: func(ctx context.Context, _, _ int) error {
			if noDeadline {
				ctx = context.WithoutCancel(ctx)
			}
			ok, err := a.admit(ctx, key(next.Add(1)))
			if err == nil && !ok {
				denied.Add(1)
			}
			calls.Add(1)
			return err
		},
		after: func() error {
			if n := denied.Load(); n > 0 {
				return fmt.Errorf("%d of %d calls denied: %s", n, calls.Load(), why)
			}
			return nil
		},
	}
}

// warm admits every key once, 16 at a time; any denial is an error.
func warm(ctx context.Context, a admitter, keys []string) error {
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for g := range errs {
		wg.Go(func() {
			for i := g; i < len(keys) && errs[g] == nil; i += len(errs) {
				ok, err := a.admit(ctx, keys[i])
				if err == nil && !ok {
					err = fmt.Errorf("warming %s: denied", keys[i])
				}
				errs[g] = err
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
