package funnel_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// A scriptHook is a go-redis hook (client.AddHook) that acts at the runs of
// one script on its client, from outside the Limiter: before, if not nil,
// is called with the command ahead of each run (an EVALSHA of the script's
// hash, or its EVAL after NOSCRIPT; alone or in a pipeline), in the
// goroutine that sends it; after, if not nil, once Redis answered it,
// before its caller gets the reply. Runs counts the runs that Redis did not
// answer NOSCRIPT: one a script's run, however it was sent.
type scriptHook struct {
	sha    string
	before func(cmd redis.Cmder)
	after  func(cmd redis.Cmder)
	runs   atomic.Int64
}

var _ redis.Hook = (*scriptHook)(nil)

// runsScript reports whether cmd runs the script of hash sha.
func runsScript(cmd redis.Cmder, sha string) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	switch strings.ToLower(cmd.Name()) {
	case "evalsha", "evalsha_ro":
		return strings.EqualFold(fmt.Sprint(args[1]), sha)
	case "eval", "eval_ro":
		sum := sha1.Sum([]byte(fmt.Sprint(args[1])))
		return hex.EncodeToString(sum[:]) == sha
	}
	return false
}

// count counts cmd's run, unless Redis answered NOSCRIPT (err is a lone
// command's error as the next hook returned it).
func (h *scriptHook) count(cmd redis.Cmder, err error) {
	if err == nil {
		err = cmd.Err()
	}
	if err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
		h.runs.Add(1)
	}
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !runsScript(cmd, h.sha) {
			return next(ctx, cmd)
		}
		if h.before != nil {
			h.before(cmd)
		}
		err := next(ctx, cmd)
		h.count(cmd, err)
		if h.after != nil {
			h.after(cmd)
		}
		return err
	}
}

func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var mine []redis.Cmder
		for _, cmd := range cmds {
			if runsScript(cmd, h.sha) {
				mine = append(mine, cmd)
			}
		}
		if h.before != nil {
			for _, cmd := range mine {
				h.before(cmd)
			}
		}
		err := next(ctx, cmds)
		for _, cmd := range mine {
			h.count(cmd, nil)
			if h.after != nil {
				h.after(cmd)
			}
		}
		return err
	}
}

// scriptArg returns the integer argument i (from 0, ARGV[i+1]) of a
// script's command cmd, or false when it has none.
func scriptArg(cmd redis.Cmder, i int) (int64, bool) {
	args := cmd.Args()
	if len(args) < 3 {
		return 0, false
	}
	nkeys, err := strconv.Atoi(fmt.Sprint(args[2]))
	if err != nil || 3+nkeys+i >= len(args) {
		return 0, false
	}
	switch v := args[3+nkeys+i].(type) {
	case int64:
		return v, true
	case *int64:
		return *v, true
	default:
		n, err := strconv.ParseInt(fmt.Sprint(v), 10, 64)
		return n, err == nil
	}
}
