package mutex

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// votes are the nodes' answers to one call of a quorum (a lock's or a
// semaphore's): the value each node that said yes answered (a lease in ms,
// the handles left open), how many said no, the errors, the shortest wait a
// refusing node reported (-1: none), and a node's report that the call
// cannot succeed (a semaphore of another size).
type votes struct {
	yes  []int64
	no   int
	errs []error
	wait int64
	bad  error
}

// A ballot reads one node's reply into v; its error counts as the node's.
type ballot func(v *votes, reply any) error

// poll runs script on every node (fan) and counts their replies with read.
func (q *quorum) poll(ctx context.Context, script *redis.Script, keys []string, args []any, read ballot) votes {
	v := votes{wait: -1}
	for _, nr := range q.fan(ctx, script, keys, args) {
		err := nr.err
		if err == nil {
			err = read(&v, nr.reply)
		}
		if err != nil {
			v.errs = append(v.errs, err)
		}
	}
	return v
}

// refused records a node's refusal, free again after wait ms.
func (v *votes) refused(wait int64) {
	v.no++
	if v.wait < 0 || wait < v.wait {
		v.wait = wait
	}
}

// nth returns the value that need of the nodes that said yes have at least
// (the need-th largest: the lease they all still have), or -1 when fewer
// than need said yes.
func (v *votes) nth(need int) int64 {
	if len(v.yes) < need {
		return -1
	}
	slices.Sort(v.yes)
	return v.yes[len(v.yes)-need]
}

// refusal is the error of an acquisition that did not win need of nodes in
// time: ErrNoQuorum when too many nodes failed for need to grant it, or
// when enough did but the call took too long (took, of a lease); nil when
// the nodes refused it.
func (v *votes) refusal(nodes, need int, took, lease time.Duration) error {
	switch {
	case len(v.errs) > nodes-need:
		return noQuorum(fmt.Sprintf("%d of %d nodes failed, %d must grant", len(v.errs), nodes, need), v.errs)
	case len(v.yes) >= need:
		return noQuorum(fmt.Sprintf("acquiring took %v of a %v lease", took, lease), v.errs)
	}
	return nil
}

// verdict reads the votes of a holder's call (what: extend, unlock, ttl,
// release): nil when need of nodes said yes (did, say "hold the lock"),
// ErrNotHeld when too many said no for need to, otherwise an error matching
// ErrNoQuorum joined with the nodes' errors.
func (v *votes) verdict(nodes, need int, what, did string) error {
	switch {
	case len(v.yes) >= need:
		return nil
	case v.no > nodes-need:
		return ErrNotHeld
	}
	return noQuorum(fmt.Sprintf("%s: %d of %d nodes %s, %d failed, %d must", what, len(v.yes), nodes, did, len(v.errs), need), v.errs)
}

// readAcquire reads a node's reply to the acquire script: a grant's lease,
// or a refusal with the wait it reported (the holder's lease, or a
// rejoining node's delay). A re-entry that found no lock on the node
// ({0, -2}) counts for nothing.
func readAcquire(v *votes, reply any) error {
	r, res, err := acquired(reply)
	switch {
	case err != nil:
		return err
	case r[0] == 1:
		v.yes = append(v.yes, r[1])
	case r[0] == 0 && r[1] >= 0:
		v.refused(r[1]) // held by another: free again after its lease at most
	case r[0] == declinedReply:
		if w, ok := rejoinWait(res); ok {
			v.refused(w)
		}
	}
	return nil
}

// rejoinWait reads the rejoin gate's result: the ms until the node grants.
func rejoinWait(res any) (int64, bool) {
	arr, _ := res.([]any)
	if len(arr) == 0 {
		return 0, false
	}
	w, ok := arr[0].(int64)
	return w, ok
}

// readHolder returns the ballot of a holder's script (extend, pttl,
// release): yes with the script's value when the handle holds the lock on
// the node, no when the value is notHeld.
func readHolder(notHeld int64) ballot {
	return func(v *votes, reply any) error {
		r, _, err := ints(reply, 1) // an integer, or an array led by one
		switch {
		case err != nil:
			return err
		case r[0] == notHeld:
			v.no++
		default:
			v.yes = append(v.yes, r[0])
		}
		return nil
	}
}
