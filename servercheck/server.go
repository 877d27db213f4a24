package servercheck

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/redis/go-redis/v9"
)

// asking is one server being asked: the finding so far, and the server's
// refusals (error replies) that left a setting unknown.
type asking struct {
	ctx       context.Context
	c         redis.Cmdable
	f         Finding
	infoErr   error // INFO memory's
	configErr error // CONFIG GET maxmemory-policy's
}

// settings reads into a.f the server's address, then maxmemory and
// maxmemory-policy from INFO memory (which works where CONFIG is renamed),
// then from CONFIG GET what INFO did not give. Its error is that of a
// server that did not answer: a refusal only leaves a setting unknown.
func (a *asking) settings() error {
	if err := a.address(); err != nil {
		return err
	}
	info, err := a.c.Info(a.ctx, "memory").Result()
	if a.infoErr = err; unreached(err) != nil {
		return err
	}
	a.f.MaxMemory, a.f.Policy = parseInfo(info)
	if a.f.Policy == "" {
		a.f.Policy, a.configErr = configGet(a.ctx, a.c, "maxmemory-policy")
	}
	if err := unreached(a.configErr); err != nil {
		return err
	}
	return a.configMaxMemory()
}

// configMaxMemory asks CONFIG GET for a memory limit INFO did not give,
// when it matters: once the policy is known.
func (a *asking) configMaxMemory() error {
	if a.f.MaxMemory >= 0 || a.f.Policy == "" {
		return nil
	}
	v, err := configGet(a.ctx, a.c, "maxmemory")
	a.f.MaxMemory = parseBytes(v) // v is "" on an error
	return unreached(err)
}

// address asks the server for its side of the connection (CLIENT INFO
// laddr) when the client does not know it.
func (a *asking) address() error {
	if a.f.Addr != failoverAddr {
		return nil
	}
	info, err := a.c.ClientInfo(a.ctx).Result()
	if err != nil {
		return unreached(err)
	}
	a.f.Addr = cmp.Or(info.LAddr, failoverAddr)
	return nil
}

// judge sets the finding's Err and Note from its settings, or from err,
// why they could not all be read.
func (a *asking) judge(err error) {
	f := &a.f
	switch {
	case err != nil:
		f.Err = noAnswer(a.ctx, f.Addr, err)
	case f.Policy == "":
		cause := cmp.Or(errors.Join(a.infoErr, a.configErr),
			errors.New("INFO memory and CONFIG GET named no maxmemory-policy"))
		f.Err = fmt.Errorf("%w: %s: %w", ErrUnknownPolicy, f.Addr, cause)
	case f.Policy == NoEviction:
	case f.MaxMemory == 0:
		f.Note = fmt.Sprintf("maxmemory-policy %s evicts funnelguard keys once a memory limit (maxmemory) is set: set maxmemory-policy %s", f.Policy, NoEviction)
	case f.MaxMemory < 0:
		f.Err = fmt.Errorf("%w: %s has maxmemory-policy %s and an unknown maxmemory: set maxmemory-policy %s", ErrEvictionPolicy, f.Addr, f.Policy, NoEviction)
	default:
		f.Err = fmt.Errorf("%w: %s has maxmemory-policy %s and maxmemory %d bytes: set maxmemory-policy %s", ErrEvictionPolicy, f.Addr, f.Policy, f.MaxMemory, NoEviction)
	}
}

// parseInfo reads maxmemory (-1 if absent) and maxmemory_policy ("" if
// absent) from an INFO reply.
func parseInfo(info string) (maxMemory int64, policy string) {
	maxMemory = -1
	for line := range strings.Lines(info) {
		switch k, v, _ := strings.Cut(strings.TrimSpace(line), ":"); {
		case k == "maxmemory":
			maxMemory = parseBytes(v)
		case k == "maxmemory_policy":
			policy = v
		}
	}
	return maxMemory, policy
}

// parseBytes reads a maxmemory value, which is never negative: -1 if v is
// none.
func parseBytes(v string) int64 {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// configGet returns the value of one CONFIG GET parameter, "" with a nil
// error if the server has no such parameter.
func configGet(ctx context.Context, c redis.Cmdable, param string) (string, error) {
	m, err := c.ConfigGet(ctx, param).Result()
	return m[param], err
}

// unreached returns err if it is a failure to reach the server; nil if err
// is nil or the server's own answer (an error reply: an unknown or refused
// command).
func unreached(err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return nil
	}
	return err
}

// noAnswer is the error of a server at addr that did not answer, with
// ctx's end (a client's i/o timeout can come a moment before ctx's timer).
func noAnswer(ctx context.Context, addr string, err error) error {
	if cerr := ctxcall.Ended(ctx); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %s: %w: %w", ErrNoAnswer, addr, cerr, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrNoAnswer, addr, err)
}
