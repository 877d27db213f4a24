package guard

import (
	"errors"
	"slices"
	"strings"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// transientReplies are the codes of the Redis error replies a later call
// may not get: loading, failing over, busy with a script, a lagging replica.
var transientReplies = []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY", "READONLY", "NOREPLICAS", "MOVED", "ASK"}

// unanswered reports whether err means that Redis could not answer in time
// (ErrUnavailable: a time-out, a refused connection, a lost quorum, a
// transient reply), not an answer that will not change (ErrRejected, whose
// doc lists them; a reply of the wrong shape too). Only the first may fail
// open.
func unanswered(err error) bool {
	var reply redis.Error
	switch {
	case err == nil, errors.Is(err, funnel.ErrCorruptState), errors.Is(err, mutex.ErrUnexpectedReply),
		errors.Is(err, redis.ErrClosed):
		return false
	case errors.As(err, &reply):
		code, _, _ := strings.Cut(reply.Error(), " ")
		return slices.Contains(transientReplies, code)
	}
	return true
}
