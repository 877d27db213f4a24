package testutil

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// A Command is one command a client sent, as a CommandRecorder saw it.
type Command struct {
	// Name is the command's name in lower case ("evalsha", "set", "multi").
	Name string
	// Script is the SHA1 of the script an EVAL, EVALSHA (or their _RO
	// forms) ran, the same for both, so that a script sent by body and one
	// sent by hash compare equal; "" for other commands.
	Script string
	// Args are the command's arguments, Name included.
	Args []any
	// Trip numbers the round trip the command went in: the commands of one
	// pipeline or MULTI/EXEC share it.
	Trip int
	// Err is the error the command got, nil on success.
	Err error
}

// Keys returns the keys of a script command (EVAL, EVALSHA), nil for
// others or when the command is malformed.
func (c Command) Keys() []string {
	if c.Script == "" || len(c.Args) < 3 {
		return nil
	}
	n, ok := toInt(c.Args[2])
	if !ok || n < 0 || 3+n > len(c.Args) {
		return nil
	}
	keys := make([]string, n)
	for i := range n {
		keys[i] = fmt.Sprint(c.Args[3+i])
	}
	return keys
}

// Shape describes the command without its data: the name, the script and
// the number of keys and arguments. Two calls that do the same Redis work on
// different keys (another user, another random token) have the same shapes.
func (c Command) Shape() string {
	if c.Script != "" {
		return fmt.Sprintf("script %.12s, %d keys, %d args", c.Script, len(c.Keys()), len(c.Args)-3-len(c.Keys()))
	}
	return fmt.Sprintf("%s, %d args", c.Name, len(c.Args)-1)
}

func toInt(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case string:
		var i int
		_, err := fmt.Sscan(n, &i)
		return i, err == nil
	}
	return 0, false
}

// A CommandRecorder is a go-redis hook that records every command a client
// sends, with its arguments (client.AddHook(rec)), where CommandCounter only
// counts them: a test compares the Redis work of two calls by what they
// send, not by how long they take. Safe for concurrent use.
type CommandRecorder struct {
	mu    sync.Mutex
	cmds  []Command
	trips int
}

var _ redis.Hook = (*CommandRecorder)(nil)

// Reset forgets the commands recorded so far.
func (h *CommandRecorder) Reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cmds, h.trips = nil, 0
}

// Commands returns the commands recorded since the last Reset, in order.
func (h *CommandRecorder) Commands() []Command {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.cmds)
}

// Trips returns how many round trips the recorded commands took.
func (h *CommandRecorder) Trips() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.trips
}

// Shapes returns the Shape of every recorded command, one round trip a
// line: see Shapes.
func (h *CommandRecorder) Shapes() []string { return Shapes(h.Commands()) }

// Shapes returns the Shape of every command of cmds, one round trip a line:
// the commands of a pipeline are joined with " | ".
func Shapes(cmds []Command) []string {
	var out []string
	last := -1
	for _, c := range cmds {
		if c.Trip == last {
			out[len(out)-1] += " | " + c.Shape()
			continue
		}
		out = append(out, c.Shape())
		last = c.Trip
	}
	return out
}

// record records one round trip's commands. err is a lone command's error as
// its hook returned it: go-redis sets the command's own error only after the
// hooks return (a pipeline's commands have theirs already).
func (h *CommandRecorder) record(cmds []redis.Cmder, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trips++
	for _, cmd := range cmds {
		args := slices.Clone(cmd.Args())
		c := Command{Name: strings.ToLower(cmd.Name()), Args: args, Trip: h.trips, Err: cmd.Err()}
		if c.Err == nil && len(cmds) == 1 {
			c.Err = err
		}
		if len(args) > 1 {
			switch c.Name {
			case "eval", "eval_ro":
				sum := sha1.Sum([]byte(fmt.Sprint(args[1])))
				c.Script = hex.EncodeToString(sum[:])
			case "evalsha", "evalsha_ro":
				c.Script = strings.ToLower(fmt.Sprint(args[1]))
			}
		}
		h.cmds = append(h.cmds, c)
	}
}

func (h *CommandRecorder) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *CommandRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.record([]redis.Cmder{cmd}, err)
		return err
	}
}

func (h *CommandRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.record(cmds, nil)
		return err
	}
}

// ScriptArgs returns the ARGV of an EVAL or EVALSHA command, nil for other
// commands.
func ScriptArgs(cmd redis.Cmder) []any {
	args := cmd.Args()
	if name := strings.ToLower(cmd.Name()); name != "evalsha" && name != "eval" || len(args) < 4 {
		return nil
	}
	keys, ok := args[2].(int)
	if !ok || 3+keys >= len(args) {
		return nil
	}
	return args[3+keys:]
}
