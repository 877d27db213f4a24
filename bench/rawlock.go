package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// libRawCommands names the column of funnelguard's own two commands sent
// with no library code around them.
const libRawCommands = "funnelguard's commands"

// rawFunnelguardLock is funnelguard's serial Lock+Unlock without funnelguard:
// the SET NX PX of a fresh token, then the EVALSHA of its release script
// (unlock.lua, with its release record) as one real Unlock sent it, the
// token and the release's stamp renewed each cycle (seq = mark = the cycle's
// number: a Locker that has had every earlier reply). This column against
// "funnelguard" is what the library's Go code costs; against "redislock",
// what the commands cost.
func rawFunnelguardLock(c *redis.Client) func(string) func(context.Context) error {
	return func(name string) func(context.Context) error {
		sha, keys, args, err := captureRelease(c.Options().Addr, name)
		if err != nil {
			return func(context.Context) error { return err }
		}
		// Go on from the captured release's number, so that its record
		// (seq below mark) is one this "Locker" has had the reply of.
		owner, rec := fmt.Sprint(args[1]), fmt.Sprint(args[2])
		seq, err := strconv.ParseUint(rec[16:32], 16, 64)
		if err != nil {
			return func(context.Context) error { return fmt.Errorf("captured seq: %w", err) }
		}
		return func(ctx context.Context) error {
			tok := newToken()
			ok, err := c.SetNX(ctx, keys[0], tok+"-", lockTTL).Result()
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("raw lock of %s: held", keys[0])
			}
			seq++
			num := fmt.Sprintf("%016x", seq) // seq and mark: every earlier reply came
			k := []string{keys[0], keys[1], keys[1] + ":" + tok}
			r, err := c.EvalSha(context.WithoutCancel(ctx), sha, k, tok+"-", owner, owner+num+":"+tok+recordTail, owner+num).Result()
			if err == nil && r != int64(0) {
				err = fmt.Errorf("raw release of %s: reply %v, want 0", keys[0], r)
			}
			return err
		}
	}
}

// captureRelease runs one Lock+Unlock of name on a client of its own at addr
// and returns the release's EVALSHA: the script's SHA, its keys (the lock,
// the name's record, the token's record) and arguments (the lock's value,
// owner, the release's record, owner and mark). A different shape means the
// release changed: an error, so that the column is not silently measuring
// something else. It gives up after captureTimeout (a hung server).
func captureRelease(addr, name string) (string, []string, []any, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	h := &releaseHook{}
	c.AddHook(h)
	ctx, cancel := context.WithTimeout(context.Background(), captureTimeout)
	defer cancel()
	l, err := mutex.New(c)
	if err != nil {
		return "", nil, nil, err
	}
	lk, err := l.Lock(ctx, name)
	if err != nil {
		return "", nil, nil, err
	}
	if err := lk.Unlock(ctx); err != nil {
		return "", nil, nil, err
	}
	a, _ := h.args.Load().([]any)
	if len(a) != 10 || fmt.Sprint(a[2]) != "3" {
		return "", nil, nil, fmt.Errorf("funnelguard's release is no longer EVALSHA of 3 keys and 4 arguments: %v", a)
	}
	keys := []string{fmt.Sprint(a[3]), fmt.Sprint(a[4]), fmt.Sprint(a[5])}
	args := make([]any, 4)
	for i := range args {
		args[i] = argText(a[6+i])
	}
	value, owner, rec, bound := args[0].(string), args[1].(string), args[2].(string), args[3].(string)
	token, _ := strings.CutSuffix(value, "-")
	if len(token) != 32 || keys[2] != keys[1]+":"+token {
		return "", nil, nil, fmt.Errorf("funnelguard's release keys changed: %v, %v", keys, args)
	}
	if len(owner) != 16 || len(rec) != 32+1+32+len(recordTail) || rec[:16] != owner || rec[32:] != ":"+token+recordTail || bound != rec[:32] {
		return "", nil, nil, fmt.Errorf("funnelguard's release arguments changed: %v", args)
	}
	return fmt.Sprint(a[1]), keys, args, nil
}

// recordTail ends the record of a plain release (mutex/record.lua's format:
// handle 0, no next owner, no handle left, no fence, no result).
const recordTail = ":r0>:0:0:f"

// captureTimeout bounds captureRelease.
const captureTimeout = 10 * time.Second

// releaseHook keeps the arguments of the last EVALSHA with 3 keys.
type releaseHook struct {
	args atomic.Value // []any
}

// DialHook passes dials through.
func (h *releaseHook) DialHook(next redis.DialHook) redis.DialHook {
	return next
}

// ProcessHook keeps an EVALSHA's arguments.
func (h *releaseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if s, _ := a[0].(string); strings.EqualFold(s, "evalsha") && len(a) > 2 && fmt.Sprint(a[2]) == "3" {
			h.args.Store(append([]any(nil), a...))
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook passes pipelines through.
func (h *releaseHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// argText is a command argument as go-redis writes it: a *string as the
// string it points to (the Locker passes some so, to allocate less).
func argText(a any) string {
	if p, ok := a.(*string); ok {
		return *p
	}
	return fmt.Sprint(a)
}
