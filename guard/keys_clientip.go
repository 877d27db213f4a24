package guard

import (
	"cmp"
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
)

// ClientIPConfig says where a request's client address comes from: the
// proxies in front of the service and the header they write. The zero value
// trusts no proxy and keys on the connection's peer, IPv6 grouped by /64.
// Do not change one in use; its methods are safe for concurrent use.
//
// The client is the rightmost untrusted hop: from the peer (r.RemoteAddr),
// while the hop is a trusted proxy, the walk steps to the entry it reported,
// the next of the forwarding header from the right. What is left of the
// rightmost untrusted entry the client wrote, and is never read. The walk
// stops at an untrusted hop (the client); at the end of the entries (the
// last hop, a proxy); or before an entry that is not an address ("unknown",
// a Forwarded element without one for=, a syntax error): at the last valid
// hop, so a misconfigured proxy over-limits but a client cannot pick its key.
//
// An address loses its port and IPv6 zone; an IPv4-mapped one becomes IPv4.
type ClientIPConfig struct {
	// TrustedProxies are the networks of the proxies in front of the
	// service, whose reports are believed. Never list a network clients
	// can send from: with 0.0.0.0/0 the key is what the client wrote.
	TrustedProxies []netip.Prefix
	// TrustedHops is a number of proxies trusted whatever their addresses,
	// the peer being the first (1: the rightmost entry is the client).
	TrustedHops int
	// Header is the forwarding header the trusted proxies write:
	// X-Forwarded-For when empty; "Forwarded" is read as RFC 7239 (for=);
	// any other (X-Real-IP) as a comma-separated list. No other is read.
	Header string
	// IPv6PrefixLen is how many leading bits of an IPv6 address make its
	// key: 64 when zero, 128 the address. Outside 0 to 128, an error.
	IPv6PrefixLen int
}

// ClientIP is shorthand for ClientIPConfig{TrustedProxies: trusted}.Key,
// with trusted copied. Without networks it keys on the peer.
func ClientIP(trusted ...netip.Prefix) KeyFunc {
	return ClientIPConfig{TrustedProxies: slices.Clone(trusted)}.Key
}

// Key returns the client's address as a key: IPv4 ("203.0.113.7"), or the
// IPv6 network of IPv6PrefixLen bits around it ("2001:db8:1:2::/64"). A
// request without a usable address is an error matching ErrNoKey.
func (c ClientIPConfig) Key(r *http.Request) (string, error) {
	a, err := c.Addr(r)
	switch {
	case err != nil:
		return "", err
	case a.Is4():
		return a.String(), nil
	}
	p, _ := a.Prefix(cmp.Or(c.IPv6PrefixLen, 64)) // Addr checked the bits
	return p.String(), nil
}

// Addr returns the client's address, not grouped. A request without a
// usable address is an error matching ErrNoKey.
func (c ClientIPConfig) Addr(r *http.Request) (netip.Addr, error) {
	if b := c.IPv6PrefixLen; uint(b) > 128 { // a negative b too
		return netip.Addr{}, fmt.Errorf("guard: ClientIPConfig.IPv6PrefixLen %d not in 0 to 128", b)
	}
	a := parseNode(r.RemoteAddr)
	if c.trusted(0, a) {
		a = c.walk(a, r.Header.Values(c.header()))
	}
	if !a.IsValid() {
		return netip.Addr{}, fixable(ErrNoKey, "the client's address is unknown")
	}
	return a, nil
}

func (c ClientIPConfig) header() string {
	return cmp.Or(textproto.CanonicalMIMEHeaderKey(c.Header), "X-Forwarded-For")
}

// walk is the walk ClientIPConfig describes, from cur, a trusted hop, over
// the header lines.
func (c ClientIPConfig) walk(cur netip.Addr, lines []string) netip.Addr {
	split := listElements
	if c.header() == "Forwarded" {
		split = forwardedElements
	}
	hop := 0
	for i := len(lines) - 1; i >= 0; i-- {
		hops := split(lines[i])
		for j := len(hops) - 1; j >= 0; j-- {
			next := parseNode(hops[j])
			if !next.IsValid() {
				return cur
			}
			cur, hop = next, hop+1
			if !c.trusted(hop, cur) {
				return cur
			}
		}
	}
	return cur
}

// trusted reports whether the hop-th hop from the right (the peer being 0),
// at a (invalid if none, which is in no network), is a believed proxy.
func (c ClientIPConfig) trusted(hop int, a netip.Addr) bool {
	return hop < c.TrustedHops || slices.ContainsFunc(c.TrustedProxies, func(p netip.Prefix) bool {
		return unmapPrefix(p).Contains(a)
	})
}

// unmapPrefix is p with an IPv4-mapped network made IPv4
// (::ffff:10.0.0.0/104 is 10.0.0.0/8), as parseNode makes the hops.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

// listElements splits an X-Forwarded-For line into its entries, left to
// right, skipping empty ones (RFC 9110, section 5.6.1).
func listElements(line string) []string {
	var hops []string
	for e := range strings.SplitSeq(line, ",") {
		if e = strings.Trim(e, " \t"); e != "" {
			hops = append(hops, e)
		}
	}
	return hops
}

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

// parseNode parses an address with an optional port (validPort):
// "192.0.2.1", "192.0.2.1:4711", "2001:db8::1", "[2001:db8::1]",
// "[2001:db8::1]:4711". The address comes back without its zone,
// IPv4-mapped as IPv4; invalid if s is none of these.
func parseNode(s string) netip.Addr {
	host, port, bracketed := splitNode(s)
	a, err := netip.ParseAddr(host)
	if err != nil || bracketed && !a.Is6() || !optionalPort(port) {
		return netip.Addr{}
	}
	return a.WithZone("").Unmap()
}

// splitNode splits a node into its host and what follows (nothing, or ':'
// and a port); bracketed reports an IPv6 host in brackets, "" if they never
// close.
func splitNode(s string) (host, port string, bracketed bool) {
	if rest, ok := strings.CutPrefix(s, "["); ok {
		if host, port, ok = strings.Cut(rest, "]"); !ok {
			return "", "", true
		}
		return host, port, true
	}
	if strings.Count(s, ":") == 1 { // an IPv6 address has two or more, and no port
		i := strings.IndexByte(s, ':')
		return s[:i], s[i:], false
	}
	return s, "", false
}

func optionalPort(s string) bool {
	p, ok := strings.CutPrefix(s, ":")
	return s == "" || ok && validPort(p)
}

// validPort reports whether p is a port number, 1 to 5 decimal digits up
// to 65535, or an RFC 7239 obfuscated port ("_a1").
func validPort(p string) bool {
	if obf, ok := strings.CutPrefix(p, "_"); ok {
		return only(obf, alnum+"._-")
	}
	n, _ := strconv.Atoi(p) // a number if only digits, at most 5
	return only(p, digits) && len(p) <= 5 && n <= 65535
}

const (
	digits = "0123456789"
	alnum  = digits + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)

// only reports whether s is not empty and made of the ASCII chars only.
func only(s, chars string) bool { return s != "" && strings.Trim(s, chars) == "" }
