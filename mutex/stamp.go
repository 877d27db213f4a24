package mutex

import (
	"crypto/rand"
	"encoding/binary"
	"slices"
	"strings"
	"sync"
	"time"
)

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
