package guard

import "strings"

// The Forwarded header (RFC 7239) is a list of elements, one per proxy,
// each a list of name=value parameters separated by ';', a value being a
// token or a quoted string; only for= is read. The client writes what is
// to the left of its proxy's element, so the boundaries must be found
// exactly where the proxies put them: a ',' in a quoted string is none, and
// after a quoted string that never ends none can be known.

// tokenChars are the bytes of an HTTP token (RFC 9110, section 5.6.2).
var tokenChars = newByteSet(alnum + "!#$%&'*+-.^_`|~")

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
	e := elementScan{s: s, empty: true}
	for e.more() {
		if !e.step() {
			return "", false, "", false
		}
	}
	return e.node(), e.empty, e.s, true
}

// elementScan is forwardedElement's scan of one element, left to right.
type elementScan struct {
	s     string // the rest of the line
	last  string // the value of the last for= parameter
	fors  int    // the number of for= parameters
	bad   bool   // a syntax error: the rest of the element says nothing
	empty bool   // nothing but white space so far
}

// more skips white space and reports whether the element goes on; at its
// end, it consumes the ',' that ends it.
func (e *elementScan) more() bool {
	e.s = strings.TrimLeft(e.s, " \t")
	switch {
	case e.s == "":
		return false
	case e.s[0] == ',':
		e.s = e.s[1:]
		return false
	}
	e.empty = false
	return true
}

// step consumes what comes next in the element: a ';' or a parameter, or
// after a syntax error a byte or a whole quoted string, so that the ','
// that ends the element is still found. It is false if a quoted string
// never ends.
func (e *elementScan) step() bool {
	switch {
	case e.bad:
		return e.skip()
	case e.s[0] == ';':
		e.s = e.s[1:]
		return true
	}
	return e.param()
}

// skip consumes a byte, or a quoted string (false if it never ends).
func (e *elementScan) skip() bool {
	if e.s[0] != '"' {
		e.s = e.s[1:]
		return true
	}
	var ok bool
	_, e.s, ok = quotedString(e.s)
	return ok
}

// param consumes a name=value parameter and notes a for= one. Anything else
// (no name, no value, something after the value other than ';' or ',') is
// a syntax error, consumed by the steps that follow. It is false if the
// value is a quoted string that never ends.
func (e *elementScan) param() bool {
	i := strings.IndexByte(e.s, '=')
	if i <= 0 || !isToken(e.s[:i]) {
		e.bad = true
		return true
	}
	name, v := e.s[:i], e.s[i+1:]
	val, rest, ok := forwardedValue(v)
	if !ok {
		e.bad, e.s = true, v
		return !strings.HasPrefix(v, `"`)
	}
	if strings.EqualFold(name, "for") {
		e.last, e.fors = val, e.fors+1
	}
	e.s = strings.TrimLeft(rest, " \t")
	e.bad = !paramEnd(e.s)
	return true
}

// paramEnd reports whether s, what follows a parameter's value, is what
// may follow it: nothing, or the next parameter or element.
func paramEnd(s string) bool {
	return s == "" || s[0] == ';' || s[0] == ','
}

// node is the element's for= node: "" unless it has exactly one and no
// syntax error.
func (e *elementScan) node() string {
	if e.bad || e.fors != 1 {
		return ""
	}
	return e.last
}

// isToken reports whether s is an HTTP token (RFC 9110, section 5.6.2).
func isToken(s string) bool {
	return s != "" && tokenChars.all(s)
}

// forwardedValue reads a token or a quoted string at the start of s. A
// token is read up to a delimiter, not checked byte by byte: an unquoted
// "[2001:db8::1]" is read as the node it means.
func forwardedValue(s string) (val, rest string, ok bool) {
	if strings.HasPrefix(s, `"`) {
		return quotedString(s)
	}
	i := strings.IndexAny(s, ",; \t\"")
	if i < 0 {
		i = len(s)
	}
	return s[:i], s[i:], i > 0
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
