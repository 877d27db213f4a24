package guard

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"
)

// ClientIPConfig says where a request's client address comes from: the
// proxies in front of the service and the header they write. Its zero value
// trusts no proxy and keys on the connection's peer, with IPv6 addresses
// grouped by /64. A ClientIPConfig must not be changed while it is in use;
// its methods are safe for concurrent use.
//
// The client is the rightmost untrusted hop. The walk starts at the peer
// (r.RemoteAddr); while the current hop is a trusted proxy, it steps to the
// hop that proxy reports, the next entry of the forwarding header from the
// right. A proxy appends the address it saw to what the client sent, so
// entries to the left of the rightmost untrusted one are whatever the client
// wrote, and are never read. The walk stops:
//
//   - at an untrusted hop: the client;
//   - when the header has no more entries: the last hop, which is trusted
//     (a request from a proxy itself, or one its proxy did not report);
//   - before an entry that is not an address ("unknown", an obfuscated
//     identifier, a syntax error, a Forwarded element without for=): at the
//     last valid hop, a trusted proxy. The chain cannot be trusted past it,
//     so every client it reports that way shares the proxy's key: a
//     misconfigured proxy over-limits, a client cannot pick its key.
//
// An address loses its port and IPv6 zone, and an IPv4-mapped IPv6 address
// (::ffff:192.0.2.1) becomes IPv4.
type ClientIPConfig struct {
	// TrustedProxies are the networks of the proxies in front of the
	// service (a load balancer's subnet, a CDN's published ranges). A hop
	// in one of them is a proxy whose report is believed. Never list a
	// network that clients can send from: with 0.0.0.0/0 every hop is
	// trusted and the key is the leftmost, which the client writes.
	TrustedProxies []netip.Prefix
	// TrustedHops is a number of proxies in front of the service whatever
	// their addresses, the peer being the first: with 1, the peer is a
	// proxy and the rightmost entry of the header is the client (a load
	// balancer whose addresses are not known in advance). A hop is trusted
	// if it is among the first TrustedHops or in TrustedProxies.
	TrustedHops int
	// Header is the forwarding header the trusted proxies write:
	// "X-Forwarded-For" when empty; "Forwarded" for RFC 7239 (for=
	// parameters); any other name (X-Real-IP, CF-Connecting-IP) is read
	// like X-Forwarded-For, a comma-separated list of addresses. Only this
	// header is read: a proxy overwrites or appends to its own, and would
	// pass another one, written by the client, through untouched.
	Header string
	// IPv6PrefixLen is the number of leading bits of an IPv6 address that
	// make its key: 64 when zero (a subscriber is usually given a /64 or
	// more, and can send from any of its addresses); 128 keys on the
	// address. Outside 0 to 128, Key and Addr return an error.
	IPv6PrefixLen int
}

// ClientIP returns a KeyFunc that keys on the client's address, trusting
// the proxies in the networks trusted: it is shorthand for
// ClientIPConfig{TrustedProxies: trusted}.Key, with trusted copied. Without
// trusted networks it keys on the connection's peer and ignores the
// forwarding headers, which the client writes.
func ClientIP(trusted ...netip.Prefix) KeyFunc {
	return ClientIPConfig{TrustedProxies: slices.Clone(trusted)}.Key
}

// Key returns the client's address as a key (see ClientIPConfig): an IPv4
// address ("203.0.113.7"), or the IPv6 network of IPv6PrefixLen bits around
// the address, in CIDR notation ("2001:db8:1:2::/64"). A request without a
// usable address is an error matching ErrNoKey.
func (c ClientIPConfig) Key(r *http.Request) (string, error) {
	a, err := c.Addr(r)
	if err != nil {
		return "", err
	}
	if a.Is4() {
		return a.String(), nil
	}
	p, err := a.Prefix(c.ipv6Bits())
	if err != nil {
		return "", err
	}
	return p.String(), nil
}

// Addr returns the client's address (see ClientIPConfig), without its port
// or zone, an IPv4-mapped address as IPv4, and not grouped. A request
// without a usable address is an error matching ErrNoKey.
func (c ClientIPConfig) Addr(r *http.Request) (netip.Addr, error) {
	if err := c.checkPrefixLen(); err != nil {
		return netip.Addr{}, err
	}
	peer := parseNode(r.RemoteAddr)
	if !c.trusted(0, peer) {
		return found(peer)
	}
	name, elements := c.header()
	return found(c.walk(peer, r.Header.Values(name), elements))
}

// checkPrefixLen rejects an IPv6PrefixLen that no IPv6 prefix has.
func (c ClientIPConfig) checkPrefixLen() error {
	if b := c.IPv6PrefixLen; b < 0 || b > 128 {
		return fmt.Errorf("guard: ClientIPConfig.IPv6PrefixLen %d not in 0 to 128", b)
	}
	return nil
}

// header is the name of the forwarding header and how a line of it splits
// into hops.
func (c ClientIPConfig) header() (string, func(line string) []string) {
	switch name := textproto.CanonicalMIMEHeaderKey(c.Header); name {
	case "":
		return "X-Forwarded-For", listElements
	case "Forwarded":
		return name, forwardedElements
	default:
		return name, listElements
	}
}

// walk steps from cur, a trusted hop, to the hops the header lines report,
// from the right, while each is trusted. It returns the first untrusted
// hop, or the last hop reached if the entries end or one is not an address.
func (c ClientIPConfig) walk(cur netip.Addr, lines []string, elements func(string) []string) netip.Addr {
	hop := 0
	for i := len(lines) - 1; i >= 0; i-- {
		hops := elements(lines[i])
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

// found is the walk's result a: the client, or an error if a is not an
// address.
func found(a netip.Addr) (netip.Addr, error) {
	if !a.IsValid() {
		return netip.Addr{}, fixable(ErrNoKey, "the client's address is unknown")
	}
	return a, nil
}

// trusted reports whether the hop-th hop from the right (the peer being 0),
// at address a (invalid if it has none), is a proxy whose report is
// believed.
func (c ClientIPConfig) trusted(hop int, a netip.Addr) bool {
	if hop < c.TrustedHops {
		return true
	}
	// An invalid a is in no network (netip.Prefix.Contains).
	for _, p := range c.TrustedProxies {
		if unmapPrefix(p).Contains(a) {
			return true
		}
	}
	return false
}

// unmapPrefix is p with an IPv4-mapped network made IPv4
// (::ffff:10.0.0.0/104 is 10.0.0.0/8), as parseNode makes the hops.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

func (c ClientIPConfig) ipv6Bits() int {
	if c.IPv6PrefixLen == 0 {
		return 64
	}
	return c.IPv6PrefixLen
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

// obfChars are the bytes of an RFC 7239 obfuscated port, after its '_'.
var obfChars = newByteSet(alnum + "._-")

var digitChars = newByteSet(digits)

// parseNode parses an address with an optional port: "192.0.2.1",
// "192.0.2.1:4711", "2001:db8::1", "[2001:db8::1]", "[2001:db8::1]:4711",
// the port possibly an RFC 7239 obfuscated one ("_a1"). The address comes
// back without its zone, IPv4-mapped as IPv4; invalid if s is none of
// these.
func parseNode(s string) netip.Addr {
	switch {
	case s == "":
		return netip.Addr{}
	case s[0] == '[':
		return parseBracketed(s[1:])
	}
	return parseBare(s)
}

// parseBracketed parses what follows the '[' of a node: an IPv6 address,
// ']', and an optional port.
func parseBracketed(s string) netip.Addr {
	host, port, ok := strings.Cut(s, "]")
	if !ok || !optionalPort(port) {
		return netip.Addr{}
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.Is6() {
		return netip.Addr{}
	}
	return a.WithZone("").Unmap()
}

// parseBare parses a node without brackets: an IPv4 address with an
// optional port, or an IPv6 address, which has two colons or more, and so
// no port.
func parseBare(s string) netip.Addr {
	host, port := s, ""
	if strings.Count(s, ":") == 1 {
		i := strings.IndexByte(s, ':')
		host, port = s[:i], s[i:]
	}
	if !optionalPort(port) {
		return netip.Addr{}
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return a.WithZone("").Unmap()
}

// optionalPort reports whether s, what follows an address, is nothing or a
// ':' and a port.
func optionalPort(s string) bool {
	p, ok := strings.CutPrefix(s, ":")
	return s == "" || ok && validPort(p)
}

// validPort reports whether p is a port number or an RFC 7239 obfport.
func validPort(p string) bool {
	if obf, ok := strings.CutPrefix(p, "_"); ok {
		return obf != "" && obfChars.all(obf)
	}
	return validPortNumber(p)
}

// validPortNumber reports whether p is 1 to 5 decimal digits, at most 65535.
func validPortNumber(p string) bool {
	if p == "" || len(p) > 5 || !digitChars.all(p) {
		return false
	}
	return len(p) < 5 || p <= "65535" // digit strings of one length compare as their numbers
}
