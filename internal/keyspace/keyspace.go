package keyspace

import (
	"errors"
	"strings"
)

// MaxPrefix is the longest prefix accepted, in bytes.
const MaxPrefix = 256

// ErrPrefix reports a prefix that would break the hash tag: it holds a brace
// or is too long.
var ErrPrefix = errors.New("prefix must be at most 256 bytes and hold no '{' or '}'")

var escaper = strings.NewReplacer("~", "~0", "{", "~1", "}", "~2")

// CheckPrefix reports whether prefix can start keys built by Key.
func CheckPrefix(prefix string) error {
	if len(prefix) > MaxPrefix || strings.ContainsAny(prefix, "{}") {
		return ErrPrefix
	}
	return nil
}

// Key returns <prefix>{<escaped name>}:<kind>. The prefix must have passed
// CheckPrefix.
func Key(prefix, name, kind string) string {
	var b strings.Builder
	Write(&b, prefix, Tag(name), kind) // one allocation
	return b.String()
}

// Write writes <prefix>{<tag>}:<kind> (tag is Tag's) to b for each kind, one
// key after another, growing b once for them all.
func Write(b *strings.Builder, prefix, tag string, kinds ...string) {
	n := len(kinds) * (len(prefix) + len(tag) + len("{}:"))
	for _, kind := range kinds {
		n += len(kind)
	}
	b.Grow(n)
	for _, kind := range kinds {
		b.WriteString(prefix)
		b.WriteByte('{')
		b.WriteString(tag)
		b.WriteString("}:")
		b.WriteString(kind)
	}
}

// Tag returns the hash tag of name, as Key writes it between the braces: the
// name itself (no allocation) when it holds no '~', '{' or '}'.
func Tag(name string) string {
	tag := escaper.Replace(name)
	if tag == "" {
		tag = "~" // an empty tag would hash the whole key; escaped names never are a lone '~'
	}
	return tag
}
