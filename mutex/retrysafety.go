package mutex

import (
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
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

// The retry-safety layer (PROTOCOL.md, "Deadlines and retries"), entered
// once per acquisition (acquireSafely) and per release sent (releaseSafely).

// An attemptFunc makes one acquire round trip under n's token, adopted
// from the orphan memory or fresh.
type attemptFunc func(n names, adopted bool) ([3]int64, any, error)

// acquireSafely makes an attempt under a remembered token of name if there
// is one, else a fresh one; once more after clearing a spent token's lock.
func (l *Locker) acquireSafely(ctx context.Context, name string, try attemptFunc) (n names, adopted bool, r [3]int64, res any, err error) {
	n, adopted, r, res, err = l.tryToken(name, try)
	if err == nil && r[0] == 0 && l.clearSpent(ctx, name) {
		return l.tryToken(name, try)
	}
	return n, adopted, r, res, err
}

// tryToken makes one attempt. It remembers the token again when the attempt
// got no lock and may yet run, or used a remembered token.
func (l *Locker) tryToken(name string, try attemptFunc) (names, bool, [3]int64, any, error) {
	n, adopted := l.orphans.remove(name, func(names) bool { return true }) // the oldest
	if !adopted {
		n = l.names(name)
	}
	r, res, err := try(n, adopted)
	if (err != nil || r[0] != 1) && (adopted || (l.honours && unknownOutcome(err) && !errors.Is(err, ErrUnreachable))) {
		l.orphans.put(name, n)
	}
	return n, adopted, r, res, err
}

// releaseSafely numbers the release for its record, repeats a hand-over
// only if no attempt adopted its token meanwhile (reclaim), and undoes or
// remembers a hand-over of unknown outcome.
func (l *Locker) releaseSafely(ctx context.Context, r *release) (any, error) {
	var late func(any, error)
	if nh := r.nh; nh != nil {
		r.foreign = r.again != nil && !l.reclaim(nh)
		late = func(any, error) { l.undoIf(nh, true, nil) } // nobody holds it
	}
	seq, st := l.releases.begin()
	res, err, failed := r.roundTrip(ctx, st, late)
	// A reply that came, even one of the wrong shape, says the release ran.
	l.releases.end(seq, failed == nil || errors.Is(failed, ErrUnexpectedReply))
	if r.nh != nil && !r.foreign && l.honours && unknownOutcome(failed) {
		l.orphans.put(r.h.name, r.nh.names)
	}
	return res, err
}

// Bounds of the memory: past maxTokens a name's oldest token is forgotten,
// past maxOrphans names one of them (any) with its tokens; an orphan
// forgotten lasts until its lease ends.
const (
	maxOrphans = 1024
	maxTokens  = 4
)

// byName is a bounded memory of tokens by name, oldest first.
type byName[T any] struct {
	n  atomic.Int64 // len(m): zero on the common path, which then takes no lock
	mu sync.Mutex
	m  map[string][]T
}

// addLocked appends x to name's entries. b.mu is held.
func (b *byName[T]) addLocked(name string, x T) {
	ts := b.m[name]
	if ts == nil && len(b.m) >= maxOrphans {
		for k := range b.m {
			delete(b.m, k)
			break
		}
	}
	if len(ts) == maxTokens {
		ts = ts[1:]
	}
	b.setLocked(name, append(ts[:len(ts):len(ts)], x))
}

// setLocked makes ts the entries of name (none: forgets it). b.mu is held.
func (b *byName[T]) setLocked(name string, ts []T) {
	if len(ts) == 0 {
		delete(b.m, name)
	} else {
		if b.m == nil {
			b.m = make(map[string][]T)
		}
		b.m[name] = ts
	}
	b.n.Store(int64(len(b.m)))
}

// remove takes the oldest of name's entries that match.
func (b *byName[T]) remove(name string, match func(T) bool) (T, bool) {
	var none T
	if b.n.Load() == 0 {
		return none, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ts := b.m[name]
	for i, x := range ts {
		if match(x) {
			b.setLocked(name, append(ts[:i:i], ts[i+1:]...))
			return x, true
		}
	}
	return none, false
}

// orphans are the names of attempts with an unknown outcome.
type orphans struct{ byName[names] }

func (o *orphans) put(name string, n names) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !slices.ContainsFunc(o.m[name], func(x names) bool { return x.token == n.token }) {
		o.addLocked(name, n)
	}
}

// spentLeases is how long, in leases, a spent token is looked for.
const spentLeases = 3

//go:embed spent.lua
var spentBody string

var spentScript = redis.NewScript(withValue(spentBody))

type spentToken struct {
	token string
	until time.Time
}

// spent are the adopted tokens whose hold released the lock.
type spent struct{ byName[spentToken] }

func (s *spent) put(name, token string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addLocked(name, spentToken{token, until})
}

// args returns name's spent tokens still looked for at now, as spent.lua's
// arguments.
func (s *spent) args(name string, now time.Time) []any {
	if s.n.Load() == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := slices.DeleteFunc(slices.Clone(s.m[name]), func(t spentToken) bool { return !now.Before(t.until) })
	s.setLocked(name, ts)
	args := make([]any, len(ts))
	for i, t := range ts {
		args[i] = t.token
	}
	return args
}

// spend remembers h's token as spent when it was adopted. A token handed on
// locally lives on in the next hold, which inherits adopted.
func (single) spend(h *hold) {
	if l := h.locker; h.adopted {
		l.spent.put(h.name, h.token, time.Now().Add(spentLeases*l.defaults.ttl))
	}
}

// clearSpent deletes the lock on name if a spent token holds it, and
// reports whether it did: the caller then tries again.
func (l *Locker) clearSpent(ctx context.Context, name string) bool {
	args := l.spent.args(name, time.Now())
	if len(args) == 0 {
		return false
	}
	reply, _ := l.run(ctx, spentScript, []string{l.LockKey(name)}, args, nil) // an error's reply is nil
	i, err := integer(reply)
	if err != nil || i < 1 || i > int64(len(args)) {
		return false
	}
	l.spent.remove(name, func(t spentToken) bool { return t.token == args[i-1] })
	return true
}

// releases numbers a Locker's releases and knows which had their reply: a
// record is overwritten only once nobody can repeat its release (record.lua).
type releases struct {
	owner any // the Locker's random id in the records, stampDigits hex digits, boxed once

	mu      sync.Mutex
	next    uint64    // the number of the next release, from 1
	pending []uint64  // releases in flight, in ascending order
	failed  uint64    // the lowest release without a reply still protected; 0: none
	until   time.Time // when failed's protection ends
}

func newReleases() *releases {
	return &releases{owner: newSemToken()[:stampDigits], next: 1} // random hex, as a token's
}

// A stamp is a release's number; every release of owner below mark has had
// its reply.
type stamp struct {
	owner     any // the Locker's id, boxed once
	seq, mark uint64
}

// noStamp is the stamp of a release that overwrites no record (a quorum's).
var noStamp = stamp{owner: strings.Repeat("0", stampDigits)}

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

// releaseArgs returns the stamp as release.lua takes it.
func (s stamp) releaseArgs() (owner, seq, mark any) {
	var b [2 * stampDigits]byte
	putHex(b[:stampDigits], s.seq)
	putHex(b[stampDigits:], s.mark)
	t := string(b[:])
	return s.owner, t[:stampDigits], t[stampDigits:]
}

// recordTail follows the token in unlock.lua's record (record.lua's format).
const recordTail = ":r0>:0:0:f"

// unlockArgs returns unlock.lua's arguments for the release of token.
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
	// go-redis writes a *string as its value: one allocation for all.
	a := &unlockArgv{rec: t[:recLen], bound: t[recLen:]}
	a.args = [4]any{value, s.owner, &a.rec, &a.bound}
	return a.args[:]
}

type unlockArgv struct {
	args       [4]any
	rec, bound string
}

// stampDigits is the width of each part of a stamp: a 64-bit number in hex.
const stampDigits = 16

// putHex writes v to b[:stampDigits] in lower-case hex (hex.Encode's), so
// that record.lua may compare stamps as text.
func putHex(b []byte, v uint64) {
	var raw [stampDigits / 2]byte
	binary.BigEndian.PutUint64(raw[:], v)
	hex.Encode(b, raw[:])
}

// end reports the reply of release seq (answered false: it may be repeated).
func (r *releases) end(seq uint64, answered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := slices.Index(r.pending, seq) // begin added it, and only end removes it
	r.pending = slices.Delete(r.pending, i, i+1)
	if answered {
		return
	}
	if r.failed == 0 || seq < r.failed {
		r.failed = seq
	}
	r.until = time.Now().Add(recordTTL)
}

// undoLate handles an acquire reply that came after its caller left.
func (l *Locker) undoLate(h *hold) func(any, error) {
	return func(reply any, err error) {
		r, _, aerr := acquired(reply)
		l.undoIf(h, err == nil && aerr == nil && r[0] == 1, err)
	}
}

// undoIf releases h's lock, which a late reply says an attempt took or may
// have taken, unless an attempt adopted it since (reclaim). An unknown
// outcome is undone only on a client that ignores deadlines: on one that
// honours them the token was remembered for the next attempt to adopt.
func (l *Locker) undoIf(h *hold, took bool, err error) {
	if (took || (!l.honours && unknownOutcome(err) && !reach.Unreachable(err))) && l.reclaim(h) {
		l.releaseOrphan(h)
	}
}

// reclaim reports whether a late reply, or a repeated hand-over to h, may
// act on h's lock: only if no attempt adopted h's token, which it then
// takes out of the orphan memory (not there: adopted, or forgotten).
func (l *Locker) reclaim(h *hold) bool {
	if !l.honours {
		return true
	}
	_, ok := l.orphans.remove(h.name, func(x names) bool { return x.token == h.token })
	return ok
}

// unknownOutcome reports whether a command that failed with err may have
// run: err is not Redis's reply (a time-out, a lost connection).
func unknownOutcome(err error) bool {
	return err != nil && err != redis.Nil && !isReply(err)
}

func isReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

// releaseOrphan releases h, a lock an attempt took after its caller gave
// up, once the server answers a PING (outage.Answering): failed dials would
// feed go-redis's dial breaker.
func (l *Locker) releaseOrphan(h *hold) {
	ctx, cancel := ctxcall.DeadlineOnly(context.Background(), time.Now().Add(unlockTimeout))
	defer cancel()
	if l.dial != nil && outage.Answering(ctx, l.dial) != nil {
		return // no answer throughout: the lease ends the orphan
	}
	l.releaseRoot(ctx, h)
}

func (l *Locker) releaseRoot(ctx context.Context, h *hold) {
	seq, st := l.releases.begin()
	keys, args := releaseCall(&h.names, argZero, l.fenceMS, st)
	_, err := l.run(ctx, releaseScript, keys, args, nil)
	l.releases.end(seq, err == nil)
}

// releaseCall returns release.lua's keys and arguments, to no next owner.
func releaseCall(n *names, id, fenceMS any, st stamp) ([]string, []any) {
	owner, seq, mark := st.releaseArgs()
	return scriptCall(nil, n, true, n.token, id, argFresh, 0, fenceMS, owner, seq, mark)
}
