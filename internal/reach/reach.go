package reach

import (
	"context"
	"errors"
	"net"
	"slices"
	"syscall"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/redis/go-redis/v9"
)

// ErrUnreachable is in the chain of every error that Mark marks. The
// libraries export it as mutex.ErrUnreachable and funnel.ErrUnreachable.
var ErrUnreachable = errors.New("redis unreachable")

// refusals are the errors of a connection that the network or the host
// refused at once: nothing was sent on it.
var refusals = []error{syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.EHOSTDOWN, syscall.ENETDOWN}

// Unreachable reports whether err says that Redis cannot be reached now:
// go-redis's client was closed (redis.ErrClosed), a dial was refused or
// found no route, or failed otherwise (a name that does not resolve) but
// not by a time-out or the end of its context. Such a command never reached
// Redis. An error that a time-out caused (a dial included: a server that
// does not answer its SYN may be hung, not gone) is not unreachable.
func Unreachable(err error) bool {
	switch {
	case err == nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, ErrUnreachable), errors.Is(err, redis.ErrClosed),
		slices.ContainsFunc(refusals, func(r error) bool { return errors.Is(err, r) }):
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return !ctxcall.TimedOut(op.Err)
	}
	return false
}

// Mark returns err with ErrUnreachable in its chain when Unreachable(err),
// and err itself otherwise. Its message is err's.
func Mark(err error) error {
	if !Unreachable(err) || errors.Is(err, ErrUnreachable) {
		return err
	}
	return &unreachable{err}
}

type unreachable struct{ err error }

func (u *unreachable) Error() string { return u.err.Error() }

func (u *unreachable) Unwrap() []error { return []error{ErrUnreachable, u.err} }
