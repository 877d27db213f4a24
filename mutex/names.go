package mutex

import (
	"crypto/rand"
	"strings"

	"github.com/funnelguard/funnelguard/internal/keyspace"
)

// names are the strings one token's lock on one name needs: its keys and
// the value a fresh lock takes. They are cut from one string, built in one
// allocation, since every acquisition needs a new set.
type names struct {
	key   string // the lock: Key(name, "lock")
	fkey  string // the fencing counter, Key(name, "fence"); "" without fencing
	nkey  string // the name's release record, Key(name, "record")
	tkey  string // the token's release record, Key(name, "record:<token>")
	token string // tokenLen hex digits of random bits
	value string // the lock's value while nobody waits for it (putFreeValue)
}

// names returns the names of a new token's lock on name.
func (l *Locker) names(name string) names {
	var raw [tokenLen / 2]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails (Go 1.24+)
	tag := keyspace.Tag(name)
	base := len(l.prefix) + len(tag) + 3 // <prefix>{<tag>}:
	size := base + len("lock") + base + len("record:") + tokenLen + freeLen
	if l.fenceTTL > 0 {
		size += base + len("fence")
	}
	var b strings.Builder
	b.Grow(size)
	writeBase(&b, l.prefix, tag)
	b.WriteString("lock")
	keyEnd := b.Len()
	if l.fenceTTL > 0 {
		writeBase(&b, l.prefix, tag)
		b.WriteString("fence")
	}
	fenceEnd := b.Len()
	writeBase(&b, l.prefix, tag)
	b.WriteString("record")
	recordEnd := b.Len()
	// ":" and the token end the token's record key; the value follows.
	var tail [1 + tokenLen + freeLen]byte
	tail[0] = ':'
	putFreeValue(tail[1+tokenLen:], raw[:])
	copy(tail[1:1+tokenLen], tokenOf(tail[1+tokenLen:]))
	b.Write(tail[:])
	s := b.String()
	tokenEnd := len(s) - freeLen
	n := names{
		key:   s[:keyEnd],
		nkey:  s[fenceEnd:recordEnd],
		tkey:  s[fenceEnd:tokenEnd],
		token: s[recordEnd+1 : tokenEnd],
		value: s[tokenEnd:],
	}
	if fenceEnd > keyEnd {
		n.fkey = s[keyEnd:fenceEnd]
	}
	return n
}

// writeBase writes <prefix>{<tag>}: to b, the start of every key of a name.
func writeBase(b *strings.Builder, prefix, tag string) {
	b.WriteString(prefix)
	b.WriteByte('{')
	b.WriteString(tag)
	b.WriteString("}:")
}
