package mutex

import (
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed fence.lua
	fenceSrc string
	//go:embed held.lua
	heldSrc string
	//go:embed acquire.lua
	acquireBody string
	//go:embed release.lua
	releaseBody string
	//go:embed extend.lua
	extendBody string
	//go:embed pttl.lua
	pttlBody string
)

// Scripts are assembled from their body and the Lua functions they call.
var (
	acquireSrc = fenceSrc + acquireBody
	releaseSrc = fenceSrc + heldSrc + releaseBody
	extendSrc  = heldSrc + extendBody
	pttlSrc    = heldSrc + pttlBody
)

// Scripts are immutable after init (redis.Script caches only its own SHA).
var (
	acquireScript = redis.NewScript(acquireSrc)
	releaseScript = redis.NewScript(releaseSrc)
	extendScript  = redis.NewScript(extendSrc)
	pttlScript    = redis.NewScript(pttlSrc)
)

// declinedReply is the first element of an acquire script's reply when its
// gate declined (fragment.go). Small and positive: go-redis boxes it without
// an allocation, unlike -1.
const declinedReply = 2

// The number of KEYS and ARGV each of the lock's scripts takes; in a
// Fragment's scripts they come after the fragment's own (see cutTail). The
// acquire and release scripts take the fencing counter's key only when
// their fencing argument (its TTL, at these positions) is not 0.
const (
	acquireKeys, acquireArgs = 2, 4
	releaseKeys, releaseArgs = 2, 5
	heldKeys, heldArgs       = 1, 2

	acquireFenceArg, releaseFenceArg = 4, 5
)

// ints reads the first min (at most 3) integers of a script's array reply,
// and returns them with the rest of the reply.
func ints(reply any, min int) ([3]int64, []any, error) {
	var out [3]int64
	arr, ok := reply.([]any)
	if !ok || len(arr) < min {
		return out, nil, fmt.Errorf("%w: %T %v", ErrUnexpectedReply, reply, reply)
	}
	for i := range min {
		n, ok := arr[i].(int64)
		if !ok {
			return out, nil, fmt.Errorf("%w: element %d is %T", ErrUnexpectedReply, i, arr[i])
		}
		out[i] = n
	}
	return out, arr[min:], nil
}

// acquired reads an acquire script's reply: {1 or 0, lease or PTTL ms,
// fence, [result]}, or {declinedReply, result...} when its gate declined
// (the result is then the rest of the reply).
func acquired(reply any) ([3]int64, any, error) {
	if arr, ok := reply.([]any); ok && len(arr) > 0 && arr[0] == any(int64(declinedReply)) {
		return [3]int64{declinedReply}, arr[1:], nil
	}
	r, rest, err := ints(reply, 3)
	var res any
	if len(rest) > 0 {
		res = rest[0]
	}
	return r, res, err
}

// integer reads a script's integer reply.
func integer(reply any) (int64, error) {
	n, ok := reply.(int64)
	if !ok {
		return 0, fmt.Errorf("%w: %T %v", ErrUnexpectedReply, reply, reply)
	}
	return n, nil
}
