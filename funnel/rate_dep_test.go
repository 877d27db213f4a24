package funnel_test

// redis_rate is the oracle of the funnel's decisions (see oracle_test.go)
// and its peer in the benchmarks.
import _ "github.com/go-redis/redis_rate/v10"
