package guard

import (
	"errors"
	"strings"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// transientReplies are the Redis error replies that a later call may not
// get: the server is loading, failing over, busy with a script, or a
// replica that has not caught up; a client that retries them would wait.
var transientReplies = []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY", "READONLY", "NOREPLICAS", "MOVED", "ASK"}

// unanswered reports whether err means that Redis could not answer in time
// (down, unreachable, slow, failing over, the key's lock busy), as opposed
// to an answer that will not change: a refusal (NOPERM, OOM, scripting
// disabled or renamed), a corrupt key (WRONGTYPE, a state that does not
// parse) or a reply of the wrong shape. Only the first may fail open.
func unanswered(err error) bool {
	var reply redis.Error
	switch {
	case err == nil:
		return false
	case errors.Is(err, funnel.ErrCorruptState), errors.Is(err, mutex.ErrUnexpectedReply),
		errors.Is(err, redis.ErrClosed):
		return false
	case errors.As(err, &reply):
		return transient(reply.Error())
	}
	// Any other error is not an answer of Redis: a time-out, a closed or
	// refused connection, an exhausted pool, a lock not obtained in time, a
	// lost quorum, a commit that kept losing its lease.
	return true
}

// transient reports whether the error reply msg starts with one of the
// transientReplies.
func transient(msg string) bool {
	for _, p := range transientReplies {
		if strings.HasPrefix(msg, p+" ") || msg == p {
			return true
		}
	}
	return false
}
