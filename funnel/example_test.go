package funnel_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

func Example() {
	m, err := miniredis.Run() // an in-process Redis for the example
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	ctx := context.Background()
	m.SetTime(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))

	lim, err := funnel.New(client)
	if err != nil {
		fmt.Println(err)
		return
	}
	cooldown := funnel.AtMost(1, time.Minute)
	daily := funnel.AtMost(10, 24*time.Hour)
	for range 2 {
		res, err := lim.Allow(ctx, "sms:+8613800138000", cooldown, daily)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(res.Allowed, res.Rule, res.RetryAfter)
	}
	// Output:
	// true  0s
	// false 1/1m0s 1m0s
}

// A Local decides the same rules in this process's memory: the fallback of
// a guard while Redis cannot answer. Times are explicit, so it needs no
// sleeping to show.
func ExampleLocal() {
	l := funnel.NewLocal(1000)
	start := time.Now()
	cooldown := funnel.AtMost(1, time.Minute)
	for _, at := range []time.Duration{0, 30 * time.Second, time.Minute} {
		res, err := l.AllowN(start.Add(at), "+8613800138000", 1, cooldown)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(at, res.Allowed, res.RetryAfter)
	}
	// Output:
	// 0s true 0s
	// 30s false 30s
	// 1m0s true 0s
}

// With a deny cache, a denied key is denied in this process until the gate
// time Redis gave, without a command to Redis; a Refund through the same
// Limiter clears it at once.
func ExampleWithDenyCache() {
	m, err := miniredis.Run() // an in-process Redis for the example
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	ctx := context.Background()

	lim, err := funnel.New(client, funnel.WithDenyCache(10000))
	if err != nil {
		fmt.Println(err)
		return
	}
	cooldown := funnel.AtMost(1, time.Minute)
	allow := func() {
		before := m.CommandCount()
		res, err := lim.Allow(ctx, "sms:+8613800138000", cooldown)
		if err != nil {
			fmt.Println(err)
			return
		}
		from := "Redis"
		if m.CommandCount() == before {
			from = "the cache"
		}
		fmt.Println(res.Allowed, res.RetryAfter.Round(time.Second), "from", from)
	}
	allow()
	allow() // denied for a minute: cached
	allow()
	if err := lim.Refund(ctx, "sms:+8613800138000", 1, cooldown); err != nil {
		fmt.Println(err)
		return
	}
	allow()
	// Output:
	// true 0s from Redis
	// false 1m0s from Redis
	// false 1m0s from the cache
	// true 0s from Redis
}

func ExampleWithReplicaAck() {
	m, err := miniredis.Run() // an in-process Redis, without replicas
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()

	// An admission counts only once one replica has its charge.
	lim, err := funnel.New(client, funnel.WithReplicaAck(1, 100*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := lim.Allow(context.Background(), "sms:+8613800138000", funnel.AtMost(3, time.Hour))
	fmt.Println(res.Allowed, errors.Is(err, mutex.ErrNotReplicated))
	// Output: false true
}

func ExampleWithPenalty() {
	m, err := miniredis.Run() // an in-process Redis for the example
	if err != nil {
		panic(err)
	}
	defer m.Close()
	m.SetTime(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)) // its clock moves only when told
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	ctx := context.Background()

	// Three code checks an hour; five denials within ten minutes, and the
	// number is shut out for a day, whatever the rule says.
	lim, err := funnel.New(client, funnel.WithPenalty(funnel.Penalty{Denials: 5, Within: 10 * time.Minute, For: 24 * time.Hour}))
	if err != nil {
		fmt.Println(err)
		return
	}
	checks := funnel.AtMost(3, time.Hour)
	for i := 1; i <= 9; i++ {
		res, err := lim.Allow(ctx, "verify:+8613800138000", checks)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(i, res.Allowed, res.Rule, res.RetryAfter.Round(time.Minute))
	}
	// Output:
	// 1 true  0s
	// 2 true  0s
	// 3 true  0s
	// 4 false 3/1h0m0s 1h0m0s
	// 5 false 3/1h0m0s 1h0m0s
	// 6 false 3/1h0m0s 1h0m0s
	// 7 false 3/1h0m0s 1h0m0s
	// 8 false penalty 24h0m0s
	// 9 false penalty 24h0m0s
}

// "10 a day", three ways, for a week: a user tries 20 times a day, every 72
// minutes, from midnight (UTC) on. AtMost(10, 24h) is a funnel: 10 at once,
// then one a day for as long as the tries go on. Window(10, 24h) gives 10
// again once the first 10 are a day old; PerDay(10, UTC) gives 10 again at
// midnight, so 20 can go through within two hours around it. (The README's
// "Choosing a rule" tables are this output.)
func Example_tenADay() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	lim, err := funnel.New(client)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	rules := []funnel.Rule{funnel.AtMost(10, 24*time.Hour), funnel.Window(10, 24*time.Hour), funnel.PerDay(10, time.UTC)}
	start := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)
	fmt.Println("day  AtMost(10, 24h)  Window(10, 24h)  PerDay(10, UTC)")
	for day := range 7 {
		var admitted [3]int
		for try := range 20 {
			m.SetTime(start.Add(time.Duration(day*20+try) * 72 * time.Minute))
			for i, r := range rules {
				res, err := lim.Allow(ctx, "user:"+r.Name, r) // a key per rule: each rule alone
				if err != nil {
					panic(err)
				}
				if res.Allowed {
					admitted[i]++
				}
			}
		}
		fmt.Printf("%d    %2d of 20         %2d of 20         %2d of 20\n", day+1, admitted[0], admitted[1], admitted[2])
	}
	// Around midnight: 10 tries at 23:00, 10 more at 00:30. The window
	// counts the last 24 hours; the calendar day starts afresh at 00:00.
	for i, at := range []time.Time{time.Date(2026, 1, 20, 23, 0, 0, 0, time.UTC), time.Date(2026, 1, 21, 0, 30, 0, 0, time.UTC)} {
		m.SetTime(at)
		var admitted [3]int
		for range 10 {
			for j, r := range rules {
				res, err := lim.Allow(ctx, "late:"+r.Name, r)
				if err != nil {
					panic(err)
				}
				if res.Allowed {
					admitted[j]++
				}
			}
		}
		fmt.Printf("%s  %2d of 10         %2d of 10         %2d of 10\n", []string{"23:00", "00:30"}[i], admitted[0], admitted[1], admitted[2])
	}
	// Output:
	// day  AtMost(10, 24h)  Window(10, 24h)  PerDay(10, UTC)
	// 1    10 of 20         10 of 20         10 of 20
	// 2     1 of 20         10 of 20         10 of 20
	// 3     1 of 20         10 of 20         10 of 20
	// 4     1 of 20         10 of 20         10 of 20
	// 5     1 of 20         10 of 20         10 of 20
	// 6     1 of 20         10 of 20         10 of 20
	// 7     1 of 20         10 of 20         10 of 20
	// 23:00  10 of 10         10 of 10         10 of 10
	// 00:30   0 of 10          0 of 10         10 of 10
}
