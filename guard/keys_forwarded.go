package guard

import "strings"

// The Forwarded header (RFC 7239) is a list of elements, one per proxy,
// each a list of name=value parameters separated by ';', a value being a
// token or a quoted string; only for= is read. The client writes what is
// to the left of its proxy's element, so the boundaries must be found
// exactly where the proxies put them: a ',' in a quoted string is none.

// forwardedElements returns the for= node (forNode) of each element of a
// Forwarded line, left to right. A quoted string that never ends ends the
// line with "": where its element ends is unknown, and the walk stops there.
func forwardedElements(line string) []string {
	elems, ok := splitQuoted(line, ',')
	var nodes []string
	for _, e := range elems {
		if strings.Trim(e, " \t") != "" { // empty elements are no hops (RFC 9110, section 5.6.1)
			nodes = append(nodes, forNode(e))
		}
	}
	if !ok {
		nodes = append(nodes, "")
	}
	return nodes
}

// splitQuoted splits s at each sep outside a quoted string; ok is false if
// a quoted string never ends, and parts then ends before its part.
func splitQuoted(s string, sep byte) (parts []string, ok bool) {
	start := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case sep:
			parts, start = append(parts, s[start:i]), i+1
		case '"':
			_, rest, ok := quotedString(s[i:])
			if !ok {
				return parts, false
			}
			i = len(s) - len(rest) - 1
		}
	}
	return append(parts, s[start:]), true
}

// forNode is the for= node of the element e, whose quoted strings end: ""
// unless it has exactly one for= parameter and no syntax error.
func forNode(e string) string {
	params, _ := splitQuoted(e, ';')
	node, fors := "", 0
	for _, p := range params {
		if p = strings.TrimLeft(p, " \t"); p == "" {
			continue
		}
		name, v, _ := strings.Cut(p, "=")
		val, ok := paramValue(v)
		if !ok || !only(name, tokenChars) {
			return ""
		}
		if strings.EqualFold(name, "for") {
			node, fors = val, fors+1
		}
	}
	if fors != 1 {
		return ""
	}
	return node
}

// tokenChars are the bytes of an HTTP token (RFC 9110, section 5.6.2).
const tokenChars = alnum + "!#$%&'*+-.^_`|~"

// paramValue reads v, what follows a parameter's '=': a quoted string or a
// token, then nothing but white space. A token is read up to a delimiter,
// not checked byte by byte: an unquoted "[2001:db8::1]" is the node it means.
func paramValue(v string) (string, bool) {
	if strings.HasPrefix(v, `"`) {
		val, rest, ok := quotedString(v)
		return val, ok && strings.Trim(rest, " \t") == ""
	}
	tok := strings.TrimRight(v, " \t")
	return tok, tok != "" && !strings.ContainsAny(tok, " \t\"")
}

// quotedString reads the quoted string at the start of s (RFC 9110,
// section 5.6.4), without its quotes and escapes; ok is false if it never
// ends.
func quotedString(s string) (val, rest string, ok bool) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '"':
			return b.String(), s[i+1:], true
		case '\\':
			if i++; i == len(s) {
				return "", "", false
			}
		}
		b.WriteByte(s[i])
	}
	return "", "", false
}

const (
	digits = "0123456789"
	alnum  = digits + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)

// only reports whether s is not empty and made of the ASCII chars only.
func only(s, chars string) bool { return s != "" && strings.Trim(s, chars) == "" }
