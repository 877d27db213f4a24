package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/ulule/limiter/v3"
	sredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

// libUlule is github.com/ulule/limiter/v3 with its go-redis v9 store: a
// fixed window per key (INCRBY, then PEXPIRE on a window's first call or
// PTTL on the others, in one script).
const libUlule = "ulule/limiter"

// perSecond is the peers' "5 a second per key": a funnel of 5 leaking 5 a
// second, redis_rate.PerSecond(5) (the same decisions), and ulule's
// limiter.Rate{Limit: 5, Period: time.Second} (a fixed window: 5 in each
// second, counted from a key's first call in it).
var perSecond = funnel.Rule{Name: "second", Capacity: 5, Leak: 5, Per: time.Second}

// perKeyCalls is how many calls each key of the per-second case gets, and
// perKeySpan how many keys are in use at once: a key's calls are perKeySpan
// calls apart (some ms at the rates measured here, well inside the 200 ms
// one unit takes to leak out), so its 2nd and 3rd calls find its state
// (funnelguard: a returning key), and no two of them overlap.
const (
	perKeyCalls = 3
	perKeySpan  = 512
)

// peersCase: the three rate limiters side by side at 5 a second per key, 3
// calls a key, every call admitted: a key's first call writes a new state,
// its next two find it. "funnelguard, no deadline" calls with
// context.WithoutCancel of the round's context, which runs in the caller's
// goroutine (the others never hand a call off).
func peersCase() benchCase {
	return benchCase{
		name: fmt.Sprintf("Allow admitted parallel, 5 a second per key, %d calls a key", perKeyCalls), parallel: true, serverCmds: true,
		ref: libUlule, turns: true,
		subjects: []subject{
			{libFunnel, perKey(funnelAdmitter(perSecond), false)},
			{libUlule, perKey(ulule, false)},
			{libRedisRate, perKey(rateAdmitter(perSecond), false)},
			{libNoDeadline, perKey(funnelAdmitter(perSecond), true)},
		},
	}
}

// ulule admits through ulule/limiter at 5 a second, its store's keys under
// the round's prefix.
func ulule(e *env) (admitter, error) {
	store, err := sredis.NewStoreWithOptions(e.client(), limiter.StoreOptions{
		Prefix: strings.TrimSuffix(e.prefix, ":"), MaxRetry: limiter.DefaultMaxRetry,
	})
	if err != nil {
		return admitter{}, err
	}
	lim := limiter.New(store, limiter.Rate{Limit: 5, Period: time.Second})
	return admitter{admit: func(ctx context.Context, key string) (bool, error) {
		c, err := lim.Get(ctx, key)
		return err == nil && !c.Reached, err
	}}, nil
}

// perKey is the per-second workload on mk's admitter: call i (from one
// counter) goes to key i%perKeySpan of the i/(perKeyCalls*perKeySpan)-th
// group of perKeySpan keys, so each key gets perKeyCalls calls; the round
// fails if any is denied. noDeadline calls with a context that cannot end.
func perKey(mk func(*env) (admitter, error), noDeadline bool) func(context.Context, *env) (workload, error) {
	return func(_ context.Context, e *env) (workload, error) {
		a, err := mk(e)
		if err != nil {
			return workload{}, err
		}
		key := func(n int64) string {
			i := n - 1
			return perKeyName(a.prefix, i/(perKeyCalls*perKeySpan), i%perKeySpan)
		}
		return admitEvery(e, a, key, noDeadline, fmt.Sprintf("5 a second must admit %d calls a key", perKeyCalls)), nil
	}
}

// perKeyName is the key of slot in group, under prefix.
func perKeyName(prefix string, group, slot int64) string {
	b := make([]byte, 0, len(prefix)+24)
	b = append(b, prefix...)
	b = append(b, 'p')
	b = strconv.AppendInt(b, group, 10)
	b = append(b, '-')
	return string(strconv.AppendInt(b, slot, 10))
}
