package mutex

import (
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed semaphore.lua
	semaphoreLib string
	//go:embed semaphore_acquire.lua
	semAcquireBody string
	//go:embed semaphore_release.lua
	semReleaseBody string
	//go:embed semaphore_extend.lua
	semExtendBody string
)

// The semaphore's scripts: each is semaphore.lua's functions and its body.
var (
	semAcquireScript = redis.NewScript(semaphoreLib + semAcquireBody)
	semReleaseScript = redis.NewScript(semaphoreLib + semReleaseBody)
	semExtendScript  = redis.NewScript(semaphoreLib + semExtendBody)
)

// Replies of semaphore_acquire.lua (the first element) and of
// semaphore_release.lua.
const (
	semGranted   = 1
	semWaiting   = 0
	semBadSize   = -1
	semEnded     = -2
	semReleased  = 1
	semDequeued  = 2
	semNotHolder = 0
)

// semNums reads a semaphore script's array reply: integers, sent as
// integers or as decimal text (times and fences exceed what Lua's number
// formatting keeps exact).
func semNums(reply any) ([]int64, error) {
	arr, ok := reply.([]any)
	if !ok || len(arr) < 2 {
		return nil, fmt.Errorf("%w: %T %v", ErrUnexpectedReply, reply, reply)
	}
	out := make([]int64, len(arr))
	for i, v := range arr {
		switch x := v.(type) {
		case int64:
			out[i] = x
		case string:
			n, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: element %d is %q", ErrUnexpectedReply, i, x)
			}
			out[i] = n
		default:
			return nil, fmt.Errorf("%w: element %d is %T", ErrUnexpectedReply, i, v)
		}
	}
	return out, nil
}
