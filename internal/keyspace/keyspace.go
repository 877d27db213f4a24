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
	return prefix + "{" + Tag(name) + "}:" + kind // one allocation
}

// Tag returns the hash tag of name, as Key writes it between the braces: the
// name itself (no allocation) when it holds no '~', '{' or '}'. A caller
// that builds several keys of one name in one buffer writes
// <prefix>{<tag>}:<kind> for each.
func Tag(name string) string {
	tag := escaper.Replace(name)
	if tag == "" {
		tag = "~" // an empty tag would hash the whole key; escaped names never are a lone '~'
	}
	return tag
}
