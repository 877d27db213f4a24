package mutex

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// run runs script on the Locker's client, returning by ctx's deadline even
// when the client ignores it (ctxcall); late, if not nil, receives a reply
// that came after the caller left.
func (l *Locker) run(ctx context.Context, script *redis.Script, keys []string, args []any, late func(any, error)) (any, error) {
	if l.batch.alone() {
		reply, err := l.runAlone(ctx, script, keys, args, late)
		l.batch.free(err)
		return reply, reach.Mark(err)
	}
	q := &queued{
		ctx:   ctx,
		add:   func(p redis.Pipeliner) redis.Cmder { return script.EvalSha(ctx, p, keys, args...) },
		again: func(p redis.Pipeliner) redis.Cmder { return script.Eval(ctx, p, keys, args...) },
	}
	if late != nil {
		q.late = func(c redis.Cmder) { late(c.(*redis.Cmd).Result()) }
	}
	cmd, err := l.batch.do(q)
	if err != nil {
		return nil, err
	}
	reply, err := cmd.(*redis.Cmd).Result()
	return reply, reach.Mark(err)
}

// runAlone is run without batching.
func (l *Locker) runAlone(ctx context.Context, script *redis.Script, keys []string, args []any, late func(any, error)) (any, error) {
	return l.runner.Run(ctx, script, keys, args, late)
}

// acquireRun runs an acquire script, followed by WAIT when the Locker waits
// for replicas (WithReplicaAck): in the same round trip for a plain attempt;
// only once the lock is granted for one with a fragment, whose gate may
// decline (a denial costs no wait). nowait skips the wait: a re-entry grants
// nobody a lock they did not hold, and WithAckAtRelease leaves it to the
// release. short reports a grant that not enough replicas acknowledged.
func (l *Locker) acquireRun(ctx context.Context, script *redis.Script, keys []string, args []any, fragment, nowait bool, late func(any, error)) (reply any, short, err error) {
	switch {
	case l.acks == 0 || nowait:
		reply, err = l.run(ctx, script, keys, args, late)
		return reply, nil, err
	case fragment:
		return l.runThenWait(ctx, script, keys, args, grants, late)
	}
	return l.runAcked(ctx, script, keys, args, late)
}

// grants reports whether an acquire script's reply granted the lock.
func grants(reply any) bool {
	r, _, err := acquired(reply)
	return err == nil && r[0] == 1
}

// undoLate returns what to do with an acquire script's reply that came after
// its caller left: release the lock of h (the attempt's token, held by
// nobody) if the attempt took it, or may have (lateUnknown), and no attempt
// adopted it meanwhile (mayUndo).
func (l *Locker) undoLate(h *hold) func(any, error) {
	return func(reply any, err error) {
		if err != nil && !l.lateUnknown(err) {
			return
		}
		if r, _, aerr := acquired(reply); (err != nil || (aerr == nil && r[0] == 1)) && l.mayUndo(h) {
			l.releaseOrphan(h)
		}
	}
}

// lateUnknown reports whether a late outcome err, an error of unknown
// outcome rather than a reply, is undone as if the attempt took the lock:
// on a client that ignores deadlines, when it may have run. On one that
// honours them the caller remembered the token (remember), and the next
// attempt adopts whatever the attempt did: a release on an unknown outcome
// would take the token from the memory and, on a server stopped past its 2
// s, leave the lock to its lease.
func (l *Locker) lateUnknown(err error) bool {
	return !l.honours && mayHaveRun(err)
}

// unknownOutcome reports whether a command that failed with err may have
// run: err is not Redis's reply (a time-out, a lost connection).
func unknownOutcome(err error) bool {
	return err != nil && err != redis.Nil && !isReply(err)
}

// isReply reports whether err is an error reply of Redis. (Its own
// function, so that the target errors.As takes the address of is not
// allocated on the calls that have no error.)
func isReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

// mayHaveRun reports whether an attempt that failed with err may have taken
// its lock: an unknown outcome, but not a refused connection (a refused
// dial sent nothing, as remember has it). Releasing after a refusal would
// only feed go-redis's dial breaker: 2 s of failed dials, up to four of
// its PoolSize, for each abandoned attempt of an outage.
func mayHaveRun(err error) bool {
	return unknownOutcome(err) && !reach.Unreachable(err)
}

// releaseOrphan releases the root handle of h, a lock that an attempt took
// after its caller gave up.
// Until the server answers a PING of its own (outage.Answering) it waits and
// sends nothing: each failed dial of go-redis counts toward its dial
// breaker, which a 2 s release would feed several times, on a server that
// refuses or on a hung one killed while the release waited for it.
func (l *Locker) releaseOrphan(h *hold) {
	ctx, cancel := ctxcall.DeadlineOnly(context.Background(), time.Now().Add(unlockTimeout))
	defer cancel()
	if l.dial != nil && outage.Answering(ctx, l.dial) != nil {
		return // no answer throughout: the lease ends the orphan
	}
	l.releaseRoot(ctx, h)
}

// orphanOf returns what to do with the late reply of a release that may
// have handed the lock to h: release it, since nobody will hold it.
func (l *Locker) orphanOf(h *hold) func(any, error) {
	return func(any, error) {
		if l.mayUndo(h) {
			l.releaseOrphan(h)
		}
	}
}

// releaseRoot releases the root handle of h, bounded by ctx (run, so even
// on a client that ignores deadlines).
func (l *Locker) releaseRoot(ctx context.Context, h *hold) {
	seq, st := l.releases.begin()
	owner, sseq, smark := st.releaseArgs()
	keys, args := scriptCall(nil, &h.names, true, h.token, argZero, argFresh, 0, l.fenceMS, owner, sseq, smark)
	_, err := l.run(ctx, releaseScript, keys, args, nil)
	l.releases.end(seq, err == nil)
}

// scriptCall returns the keys and arguments of a lock script run with
// call's fragment (nil for none): the fragment's first, then the keys of
// n's lock (lockKeys; with its release records for a release), and
// lockArgs (fragment.go).
func scriptCall(call *Call, n *names, release bool, lockArgs ...any) ([]string, []any) {
	var nk, na int
	if call != nil {
		nk, na = len(call.Keys), len(call.Args)
	}
	keys := make([]string, 0, nk+4)
	args := make([]any, 0, na+len(lockArgs))
	if call != nil {
		keys = append(keys, call.Keys...)
		args = append(args, call.Args...)
	}
	return lockKeys(keys, n, release), append(args, lockArgs...)
}

// handleID is a handle's id as the scripts take it; the root handle's needs
// no allocation.
func handleID(id uint64) string {
	if id == 0 {
		return "0"
	}
	return strconv.FormatUint(id, 10)
}

// Script arguments boxed once: converting even a constant string returned by
// a function to an interface allocates.
var (
	argZero  any = "0"
	argFresh any = ""
	argMark  any = "m"
)

// argID is handleID as a script argument.
func argID(id uint64) any {
	if id == 0 {
		return argZero
	}
	return handleID(id)
}
