package guard

import "strings"

// forwardedElements returns the for= node of each element of a Forwarded
// line (RFC 7239), left to right, unquoted; "" for an element without one,
// with two, or with a syntax error. An unterminated quoted string ends the
// line with "": where its elements end is unknown, and the walk stops there.
func forwardedElements(line string) []string {
	var nodes []string
	for s := line; s != ""; {
		node, empty, rest, ok := forwardedElement(s)
		if !ok {
			return append(nodes, "")
		}
		if !empty { // empty elements are no hops (RFC 9110, section 5.6.1)
			nodes = append(nodes, node)
		}
		s = rest
	}
	return nodes
}

// forwardedElement parses the element at the start of s, up to the first
// ',' outside a quoted string: its for= node, "" if it has none, two, or a
// syntax error; whether it is empty; and what follows the ','. ok is false
// if a quoted string in it never ends.
func forwardedElement(s string) (node string, empty bool, rest string, ok bool) {
	fors, bad := 0, false
	empty = true
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			break
		}
		if s[0] == ',' {
			s = s[1:]
			break
		}
		empty = false
		switch {
		case bad: // skip to the ',' that ends the element
			if s[0] != '"' {
				s = s[1:]
				continue
			}
			if _, s, ok = forwardedValue(s); !ok {
				return "", false, "", false
			}
			continue
		case s[0] == ';':
			s = s[1:]
			continue
		}
		i := strings.IndexByte(s, '=')
		if i <= 0 || !isToken(s[:i]) {
			bad = true
			continue
		}
		name := s[:i]
		val, r, ok := forwardedValue(s[i+1:])
		if !ok {
			if strings.HasPrefix(s[i+1:], "\"") {
				return "", false, "", false
			}
			bad, s = true, s[i+1:]
			continue
		}
		if strings.EqualFold(name, "for") {
			node, fors = val, fors+1
		}
		if s = strings.TrimLeft(r, " \t"); s != "" && s[0] != ';' && s[0] != ',' {
			bad = true
		}
	}
	if bad || fors != 1 {
		node = ""
	}
	return node, empty, s, true
}

// isToken reports whether s is an HTTP token (RFC 9110, section 5.6.2).
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

// forwardedValue reads a token or a quoted string at the start of s.
func forwardedValue(s string) (val, rest string, ok bool) {
	if s == "" {
		return "", "", false
	}
	if s[0] != '"' {
		i := strings.IndexAny(s, ",; \t\"")
		if i < 0 {
			i = len(s)
		}
		return s[:i], s[i:], i > 0
	}
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
	return "", "", false // unterminated
}
