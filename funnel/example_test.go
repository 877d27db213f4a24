package funnel_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/funnel"
	"github.com/redis/go-redis/v9"
)

func Example() {
	m, err := miniredis.Run() // an in-process Redis for the example
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	ctx := context.Background()
	m.SetTime(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))

	lim := funnel.New(client)
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
