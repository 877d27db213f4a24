package mutex

import (
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed fence.lua
	fenceSrc string
	//go:embed acquire.lua
	acquireBody string
	//go:embed release.lua
	releaseBody string
	//go:embed extend.lua
	extendBody string
	//go:embed pttl.lua
	pttlBody string
	//go:embed record.lua
	recordBody string
	//go:embed unlock.lua
	unlockBody string
)

// recordTTL is how long a release's record lasts (record.lua), and a
// released or cancelled semaphore token's (semaphore.lua's ends set).
const recordTTL = 10 * time.Second

// recordMS declares the lifetimes of a record and of the name's record key
// (three times as long), in ms as text.
var recordMS = "local record_px, record_keep = '" + strconv.FormatInt(recordTTL.Milliseconds(), 10) + "', '" +
	strconv.FormatInt(3*recordTTL.Milliseconds(), 10) + "'\n"

var recordSrc = recordMS + recordBody

// releaseNames gives release.lua's UNLESS_MARKED and YIELDED their values.
var releaseNames = strings.NewReplacer("UNLESS_MARKED", luaText(unlessMarked), "YIELDED", luaText(yielded))

func luaText(s string) string { return "'" + s + "'" }

// Scripts are assembled from their body and the Lua functions they call.
var (
	acquireSrc = fenceSrc + withValue(acquireBody)
	// releaseSrc is the lock's part of a release (lock_part); its caller
	// writes the record (releaseTail, wrapRelease).
	releaseSrc = fenceSrc + withValue(releaseNames.Replace(releaseBody))
	extendSrc  = withValue(extendBody)
	pttlSrc    = withValue(pttlBody)
	unlockSrc  = recordMS + withValue(unlockBody)
	// heldSrc is the check of a Fragment's Lock.Run (wrapHeld).
	heldSrc = withValue("return held(KEYS[1], ARGV[1], ARGV[2])")
)

// Scripts are immutable after init (redis.Script caches only its own SHA).
var (
	acquireScript = redis.NewScript(acquireSrc)
	releaseScript = redis.NewScript(recordSrc + plainCall + part("lock_part", releaseSrc) + releaseTail)
	unlockScript  = redis.NewScript(unlockSrc)
	extendScript  = redis.NewScript(extendSrc)
	pttlScript    = redis.NewScript(pttlSrc)
)

// plainCall is a plain release's call in its record, as unlock.lua writes
// it for the root ("r0>"); with the record's token it needs no digest.
const plainCall = "local release_call = 'r' .. ARGV[2] .. '>' .. ARGV[3]\n"

// releaseTail ends the plain release script: it records a release that took
// place, and replies with the handles left alone when that says all.
const releaseTail = `local r = lock_part(KEYS, ARGV)
if r[1] >= 0 and not r[4] then
  record(KEYS[2], KEYS[3], ARGV[6], ARGV[7], ARGV[8], ARGV[1], release_call, r[1], r[2], r[3])
end
if r[2] == 0 and not r[3] and not r[4] then
  return r[1]
end
return r
`

// declinedReply leads a declined gate's reply.
const declinedReply = 2

// The KEYS and ARGV counts of the lock's scripts; without the fencing TTL
// argument the counter's key (the last) is not passed.
const (
	acquireKeys, acquireArgs = 2, 4
	releaseKeys, releaseArgs = 4, 8
	heldKeys, heldArgs       = 1, 2

	acquireFenceArg, releaseFenceArg = 4, 5
)

// ints reads the first min (at most 3) integers of a script's reply and
// returns the rest; a lone integer reads as {n, 0, 0}.
func ints(reply any, min int) ([3]int64, []any, error) {
	var out [3]int64
	if n, ok := reply.(int64); ok {
		out[0] = n
		return out, nil, nil
	}
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

func acquired(reply any) ([3]int64, any, error) {
	if arr, ok := reply.([]any); ok && len(arr) > 0 && arr[0] == any(int64(declinedReply)) {
		return [3]int64{declinedReply}, arr[1:], nil
	}
	r, rest, err := ints(reply, 3)
	return r, resultOf(rest), err
}

// resultOf is a fragment's result: the first element after the lock's part.
func resultOf(rest []any) any {
	if len(rest) > 0 {
		return rest[0]
	}
	return nil
}

func integer(reply any) (int64, error) {
	n, ok := reply.(int64)
	if !ok {
		return 0, fmt.Errorf("%w: %T %v", ErrUnexpectedReply, reply, reply)
	}
	return n, nil
}
