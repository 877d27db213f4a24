package mutex

import (
	"crypto/rand"
	"encoding/hex"
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
	token string // 32 hex digits
	value string // token + "-": the lock's value while nobody waits for it
}

// names returns the names of a new token's lock on name.
func (l *Locker) names(name string) names {
	var raw [tokenLen / 2]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails (Go 1.24+)
	tag := keyspace.Tag(name)
	base := len(l.prefix) + len(tag) + 3 // <prefix>{<tag>}:
	size := base + len("lock") + base + len("record:") + tokenLen + 1
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
	var tail [1 + tokenLen + 1]byte // ":<token>-"
	tail[0], tail[len(tail)-1] = ':', '-'
	hex.Encode(tail[1:1+tokenLen], raw[:])
	b.Write(tail[:])
	s := b.String()
	n := names{
		key:   s[:keyEnd],
		nkey:  s[fenceEnd:recordEnd],
		tkey:  s[fenceEnd : len(s)-1],
		token: s[len(s)-1-tokenLen : len(s)-1],
		value: s[len(s)-1-tokenLen:],
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
