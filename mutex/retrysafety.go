package mutex

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/outage"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// An acquire attempt that its caller gave up on before the reply came (its
// context ended while Redis was paused, or the connection dropped) may still
// run: the lock is then held under a token nobody has, until its lease ends,
// and every later call of the name waits for that. So does a release that
// handed the lock to a waiting goroutine through Redis, under a fresh token
// for it, when its reply is lost: the waiter is told it got nothing. So the
// Locker remembers such tokens, by name, and its next fresh attempts on the
// name are made under them, one token each, oldest first: a lock an orphan
// took is then found to be the attempt's own, and adopted (acquire.lua
// answers a token that finds its own lock as the holder), with the lease it
// has left. An attempt that finds the lock another's puts its token back at
// the end, so that overlapping attempts of one name try every token in turn.
//
// One owner per name still holds: a remembered token is taken out of the
// memory by the one attempt that uses it (take), and goes back only if that
// attempt ended without a lock (put); a late reply that would release the
// orphan (a client that ignores deadlines, ctxcall; a batched command), and
// the repeat of a release that handed the lock over, act on its lock only if
// they can take the token back first (claim), so a lock adopted meanwhile
// is never released or handed on behind its holder. A handle that got a
// remembered token owns it, as it owns a fresh one.
//
// An orphan's command that runs only after the adopting handle released
// the lock (a starved or stopped server read it late) takes the lock again
// under the adopted token: the Locker keeps that token as spent, and its
// next attempt that finds the lock held under it deletes it (below).
// Other Lockers (other processes) cannot adopt or delete: they wait for the
// lease, or for the release of the Locker that adopted it.

// maxOrphans bounds the names a Locker remembers, and maxTokens the tokens
// it remembers for one name (attempts of one name may overlap: a batch's
// leader polling while the next tries); past either, the oldest is
// forgotten (its orphan, if any, lasts until its lease ends).
const (
	maxOrphans = 1024
	maxTokens  = 4
)

// orphans is a Locker's memory of the tokens of attempts with an unknown
// outcome, by name, oldest first. The zero value is empty and ready.
type orphans struct {
	n  atomic.Int64 // len(m): zero on the common path, which then takes no lock
	mu sync.Mutex
	m  map[string][]names
}

// take removes and returns the oldest remembered attempt on name, if any:
// attempts that find the lock another's put their token back at the end, so
// the next attempts try the others in turn.
func (o *orphans) take(name string) (names, bool) {
	if o.n.Load() == 0 {
		return names{}, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	ns := o.m[name]
	if len(ns) == 0 {
		return names{}, false
	}
	n := ns[0]
	o.set(name, ns[1:])
	return n, true
}

// put remembers n, the names of an attempt on name whose outcome is
// unknown, or that used a remembered token and got no lock.
func (o *orphans) put(name string, n names) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ns := o.m[name]
	if ns == nil && len(o.m) >= maxOrphans {
		for k := range o.m {
			delete(o.m, k)
			break
		}
	}
	for _, x := range ns {
		if x.token == n.token {
			return
		}
	}
	if len(ns) == maxTokens {
		ns = ns[1:]
	}
	o.set(name, append(ns[:len(ns):len(ns)], n))
}

// claim removes token from name's remembered attempts, and reports whether
// it was there: the caller, a late reply of that attempt (or the repeat of
// a release that handed the lock to it), may then act on the lock under it.
// If it reports false, an attempt took the token to adopt the orphan, or the
// memory forgot it: the caller leaves the lock alone.
func (o *orphans) claim(name, token string) bool {
	if o.n.Load() == 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	ns := o.m[name]
	for i, x := range ns {
		if x.token == token {
			o.set(name, append(ns[:i:i], ns[i+1:]...))
			return true
		}
	}
	return false
}

// set makes ns the remembered attempts of name (none: forgets it). o.mu is
// held.
func (o *orphans) set(name string, ns []names) {
	if len(ns) == 0 {
		delete(o.m, name)
	} else {
		if o.m == nil {
			o.m = make(map[string][]names)
		}
		o.m[name] = ns
	}
	o.n.Store(int64(len(o.m)))
}

// An attempt that adopts an orphan's token may win the lock by
// a fresh SET NX: the orphan's command had not run yet. It may still run (a
// starved or stopped server reads it from its socket buffer late), and if
// it runs after the adopting handle released the lock, it takes the lock
// again under a token nobody holds, until its lease ends. The token cannot
// go back into the orphan memory: a new handle under it would share the
// release record of the one that released it, and a replay of that release
// would be answered for the wrong handle. So the Locker keeps such a token
// apart, as spent, for spentLeases of its lease: never handed to an
// attempt, only deleted when it holds the lock. An attempt that finds the
// lock held while the name has spent tokens sends spent.lua (a
// compare-and-delete under each spent token, which writes no record and
// publishes the release if a waiter marked the lock) and, if it deleted the
// lock, tries once more. The common path pays one atomic load, and only
// when the lock was found held.
//
// One owner per name holds: a spent token's hold has ended (its last
// handle released the lock in Redis), no handle is ever made under it
// again, so the lock deleted under it is nobody's. A token handed on
// without a round trip (hold.passOn) lives on in the next hold, which
// inherits adopted, and is spent only when that hold releases.

// spentLeases is how long, in leases of the Locker (WithTTL), a spent token
// is looked for: an orphan's command that runs later than that holds the
// lock until its lease ends. The memory is bounded as the orphans' is
// (maxOrphans names, maxTokens tokens a name, the oldest forgotten).
const spentLeases = 3

//go:embed spent.lua
var spentBody string

var spentScript = redis.NewScript(withValue(spentBody))

// spentToken is one spent token and when it is forgotten.
type spentToken struct {
	token string
	until time.Time
}

// spent is a Locker's memory of spent tokens, by name, oldest first. The
// zero value is empty and ready.
type spent struct {
	n  atomic.Int64 // len(m): zero on the common path, which then takes no lock
	mu sync.Mutex
	m  map[string][]spentToken
}

// put remembers token, spent on name, until until.
func (s *spent) put(name, token string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.m[name]
	if ts == nil && len(s.m) >= maxOrphans {
		for k := range s.m {
			delete(s.m, k)
			break
		}
	}
	if len(ts) == maxTokens {
		ts = ts[1:]
	}
	s.set(name, append(ts[:len(ts):len(ts)], spentToken{token, until}))
}

// args returns name's spent tokens that are not forgotten at now, as
// spent.lua's arguments, forgetting the others.
func (s *spent) args(name string, now time.Time) []any {
	if s.n.Load() == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := slices.DeleteFunc(slices.Clone(s.m[name]), func(t spentToken) bool { return !now.Before(t.until) })
	s.set(name, ts)
	args := make([]any, len(ts))
	for i, t := range ts {
		args[i] = t.token
	}
	return args
}

// drop forgets token, whose lock spent.lua deleted.
func (s *spent) drop(name, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set(name, slices.DeleteFunc(slices.Clone(s.m[name]), func(t spentToken) bool { return t.token == token }))
}

// set makes ts the spent tokens of name (none: forgets it). s.mu is held.
func (s *spent) set(name string, ts []spentToken) {
	if len(ts) == 0 {
		delete(s.m, name)
	} else {
		if s.m == nil {
			s.m = make(map[string][]spentToken)
		}
		s.m[name] = ts
	}
	s.n.Store(int64(len(s.m)))
}

// spend remembers the token of h, whose last handle released the lock in
// Redis, when it came from the orphan memory.
func (single) spend(h *hold) {
	if l := h.locker; h.adopted {
		l.spent.put(h.name, h.token, time.Now().Add(spentLeases*l.ttl))
	}
}

// clearSpent deletes the lock on name if a spent token of the name holds
// it, after an attempt found it held, and reports whether it did: the
// caller then tries again. An error leaves things as they were (the
// attempt's ErrLocked stands).
func (l *Locker) clearSpent(ctx context.Context, name string) bool {
	args := l.spent.args(name, time.Now())
	if len(args) == 0 {
		return false
	}
	reply, err := l.run(ctx, spentScript, []string{l.LockKey(name)}, args, nil)
	if err != nil {
		return false
	}
	i, err := integer(reply)
	if err != nil || i < 1 || i > int64(len(args)) {
		return false
	}
	l.spent.drop(name, args[i-1].(string))
	return true
}

// releases numbers the releases of one Locker and knows which of them have
// had their reply, so that a release may overwrite the record its name keeps
// of an earlier release of this Locker only once nobody can ask for that
// record again (record.lua). A release whose reply never came (a lost reply,
// a time-out) may still be made again by its caller, for as long as its
// record lasts: until then, no record of that release or of a later one is
// overwritten.
type releases struct {
	owner any // the Locker's random id in the records, stampDigits hex digits, boxed once

	mu      sync.Mutex
	next    uint64    // the number of the next release, from 1
	pending []uint64  // releases in flight, in ascending order
	failed  uint64    // the lowest release without a reply still protected; 0: none
	until   time.Time // when failed's protection ends
}

func newReleases() *releases {
	var id [8]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails (Go 1.24+)
	var b [stampDigits]byte
	putHex(b[:], binary.BigEndian.Uint64(id[:]))
	return &releases{owner: string(b[:]), next: 1}
}

// A stamp is a release's place among the releases of its Locker, as the
// release scripts take it (record.lua): owner, seq and mark, stampDigits hex
// digits each, turned to text only as the script at hand needs them
// (releaseArgs, unlockArgs).
type stamp struct {
	owner     any // the Locker's id, boxed once
	seq, mark uint64
}

// noStamp is the stamp of a release that overwrites no other record (a
// quorum's): its mark is 0, so its record goes to the name's record key only
// when that is free.
var noStamp = stamp{owner: strings.Repeat("0", stampDigits)}

// begin numbers a release about to be sent and returns its stamp: every
// release of this Locker numbered below its mark has had its reply.
func (r *releases) begin() (uint64, stamp) {
	r.mu.Lock()
	seq := r.next
	r.next++
	mark := seq
	if len(r.pending) > 0 {
		mark = r.pending[0]
	}
	r.pending = append(r.pending, seq)
	if r.failed != 0 {
		if time.Now().Before(r.until) {
			mark = min(mark, r.failed)
		} else {
			r.failed = 0
		}
	}
	r.mu.Unlock()
	return seq, stamp{owner: r.owner, seq: seq, mark: mark}
}

// stampOf is the stamp of release seq of owner, when every release numbered
// below mark has had its reply.
func stampOf(owner, seq, mark uint64) stamp {
	var b [stampDigits]byte
	putHex(b[:], owner)
	return stamp{owner: string(b[:]), seq: seq, mark: mark}
}

// releaseArgs returns the stamp as release.lua takes it: owner, seq and
// mark, stampDigits hex digits each (one allocation for seq and mark).
func (s stamp) releaseArgs() (owner, seq, mark any) {
	var b [2 * stampDigits]byte
	putHex(b[:stampDigits], s.seq)
	putHex(b[stampDigits:], s.mark)
	t := string(b[:])
	return s.owner, t[:stampDigits], t[stampDigits:]
}

// recordTail is what follows the token in the record of a release made by
// unlock.lua (record.lua's format): handle 0, no next owner, no handle
// left, no fence, no result.
const recordTail = ":r0>:0:0:f"

// unlockArgs returns unlock.lua's arguments for the release of token,
// whose lock holds value: value, the owner, the release's record, and the
// owner followed by the mark (the records of this owner below it may be
// overwritten). The record and the bound are cut from one string.
func (s stamp) unlockArgs(value any, token string) []any {
	const (
		seqEnd   = 2 * stampDigits // the record starts with the owner and seq
		tokenEnd = seqEnd + 1 + tokenLen
		recLen   = tokenEnd + len(recordTail)
	)
	var b [recLen + 2*stampDigits]byte
	owner := s.owner.(string)
	copy(b[:stampDigits], owner)
	putHex(b[stampDigits:seqEnd], s.seq)
	b[seqEnd] = ':'
	copy(b[seqEnd+1:tokenEnd], token)
	copy(b[tokenEnd:recLen], recordTail)
	copy(b[recLen:recLen+stampDigits], owner)
	putHex(b[recLen+stampDigits:], s.mark)
	t := string(b[:])
	// One allocation for the arguments: go-redis writes a *string as its
	// value, so the record and the bound are not boxed one by one.
	a := &unlockArgv{rec: t[:recLen], bound: t[recLen:]}
	a.args = [4]any{value, s.owner, &a.rec, &a.bound}
	return a.args[:]
}

// unlockArgv holds unlock.lua's arguments and the strings they point to.
type unlockArgv struct {
	args       [4]any
	rec, bound string
}

// hexDigits are a stamp's digits: lower-case, so that the release scripts
// may compare two stamps as text (record.lua).
const hexDigits = "0123456789abcdef"

// stampDigits is the width of each part of a stamp: a 64-bit number in hex.
// A record starts with its owner and seq, so that record.lua compares them
// as text; record.lua takes their width from the stamp it is given.
const stampDigits = 16

// putHex writes v to b as stampDigits hex digits.
func putHex(b []byte, v uint64) {
	for i := stampDigits - 1; i >= 0; i-- {
		b[i] = hexDigits[v&15]
		v >>= 4
	}
}

// end reports the reply of release seq: answered is false when it never
// came, so the release may have run and its caller may run it again.
func (r *releases) end(seq uint64, answered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i := slices.Index(r.pending, seq); i >= 0 {
		r.pending = slices.Delete(r.pending, i, i+1)
	}
	if answered {
		return
	}
	if r.failed == 0 || seq < r.failed {
		r.failed = seq
	}
	r.until = time.Now().Add(recordTTL)
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
