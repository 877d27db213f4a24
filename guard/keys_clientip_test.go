package guard_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/funnelguard/funnelguard/guard"
)

func prefixes(s ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, p := range s {
		ps = append(ps, netip.MustParsePrefix(p))
	}
	return ps
}

// ipCase is a request from remote with the header lines hdr (name, value,
// name, value...), and the key cfg should give: want, or an error matching
// err.
type ipCase struct {
	name   string
	cfg    guard.ClientIPConfig
	remote string
	hdr    []string
	want   string
	err    error
}

func runIPCases(t *testing.T, cases []ipCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/send", nil)
			r.RemoteAddr = tc.remote
			for i := 0; i+1 < len(tc.hdr); i += 2 {
				r.Header.Add(tc.hdr[i], tc.hdr[i+1])
			}
			got, err := tc.cfg.Key(r)
			if tc.err != nil {
				if err == nil || (tc.err != errAny && !errors.Is(err, tc.err)) {
					t.Fatalf("Key = %q, %v; want an error matching %v", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Key = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// errAny in an ipCase wants an error, whichever.
var errAny = errors.New("any error")

var lan = guard.ClientIPConfig{TrustedProxies: prefixes("10.0.0.0/8", "2001:db8:ffff::/48")}

func TestClientIPPeer(t *testing.T) {
	runIPCases(t, []ipCase{
		{name: "IPv4", remote: "203.0.113.7:4711", want: "203.0.113.7"},
		{name: "IPv4 without port", remote: "203.0.113.7", want: "203.0.113.7"},
		{name: "IPv6 by /64", remote: "[2001:db8:1:2:3:4:5:6]:443", want: "2001:db8:1:2::/64"},
		{name: "IPv6 same /64", remote: "[2001:db8:1:2:ffff:ffff:ffff:ffff]:443", want: "2001:db8:1:2::/64"},
		{name: "IPv6 next /64", remote: "[2001:db8:1:3::1]:443", want: "2001:db8:1:3::/64"},
		{name: "IPv6 /48", cfg: guard.ClientIPConfig{IPv6PrefixLen: 48}, remote: "[2001:db8:1:2::1]:1", want: "2001:db8:1::/48"},
		{name: "IPv6 /128", cfg: guard.ClientIPConfig{IPv6PrefixLen: 128}, remote: "[2001:db8:1:2::1]:1", want: "2001:db8:1:2::1/128"},
		{name: "IPv6 prefix length over 128", cfg: guard.ClientIPConfig{IPv6PrefixLen: 129}, remote: "[2001:db8::1]:1", err: errAny},
		{name: "IPv4-mapped", remote: "[::ffff:203.0.113.7]:4711", want: "203.0.113.7"},
		{name: "zone", remote: "[fe80::1%eth0]:4711", want: "fe80::/64"},
		{name: "loopback", remote: "127.0.0.1:1", want: "127.0.0.1"},
		{name: "empty", remote: "", err: guard.ErrNoKey},
		{name: "unix socket", remote: "@", err: guard.ErrNoKey},
		{name: "host name", remote: "localhost:80", err: guard.ErrNoKey},
		{name: "bad port", remote: "203.0.113.7:99999", err: guard.ErrNoKey},
		{name: "IPv4 in brackets", remote: "[203.0.113.7]:1", err: guard.ErrNoKey},
		{name: "leading zeros", remote: "203.0.113.07:1", err: guard.ErrNoKey},
	})
}

// A client writes its own forwarding headers: without a trusted peer they
// are ignored, and behind one only the hops the proxies appended count.
func TestClientIPXForwardedFor(t *testing.T) {
	const xff = "X-Forwarded-For"
	hops1 := guard.ClientIPConfig{TrustedHops: 1}
	runIPCases(t, []ipCase{
		{name: "untrusted peer", remote: "203.0.113.7:1", hdr: []string{xff, "198.51.100.1"}, want: "203.0.113.7"},
		{name: "untrusted peer, Forwarded", remote: "203.0.113.7:1", hdr: []string{"Forwarded", "for=198.51.100.1"}, want: "203.0.113.7"},
		{name: "no trusted networks", cfg: guard.ClientIPConfig{}, remote: "10.0.0.1:1", hdr: []string{xff, "198.51.100.1"}, want: "10.0.0.1"},
		{name: "one proxy", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "203.0.113.7"}, want: "203.0.113.7"},
		{name: "spoofed entries to the left", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "1.2.3.4, 198.51.100.9, 203.0.113.7"}, want: "203.0.113.7"},
		{name: "spoofed trusted address to the left", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "10.9.9.9, 203.0.113.7"}, want: "203.0.113.7"},
		{name: "spoofed garbage to the left", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "garbage, unknown, 203.0.113.7"}, want: "203.0.113.7"},
		{name: "proxy chain", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "198.51.100.9, 203.0.113.7, 10.0.0.3, 10.0.0.2"}, want: "203.0.113.7"},
		{name: "header lines", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "198.51.100.9, 1.2.3.4", xff, "203.0.113.7"}, want: "203.0.113.7"},
		{name: "chain across lines", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "1.2.3.4, 203.0.113.7", xff, "10.0.0.2"}, want: "203.0.113.7"},
		{name: "all trusted", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "10.0.0.3, 10.0.0.2"}, want: "10.0.0.3"},
		{name: "trusted peer, no header", cfg: lan, remote: "10.0.0.1:1", want: "10.0.0.1"},
		{name: "trusted peer, empty header", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, ""}, want: "10.0.0.1"},
		{name: "malformed rightmost", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "203.0.113.7, garbage"}, want: "10.0.0.1"},
		{name: "unknown behind a trusted hop", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "203.0.113.7, unknown, 10.0.0.2"}, want: "10.0.0.2"},
		{name: "host name", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "client.example"}, want: "10.0.0.1"},
		{name: "empty entries", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, ",203.0.113.7,, ,"}, want: "203.0.113.7"},
		{name: "port", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "203.0.113.7:4711"}, want: "203.0.113.7"},
		{name: "IPv6", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "2001:db8:1:2::99"}, want: "2001:db8:1:2::/64"},
		{name: "IPv6 with port", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "[2001:db8:1:2::99]:4711"}, want: "2001:db8:1:2::/64"},
		{name: "IPv6 in brackets", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "[2001:db8:1:2::99]"}, want: "2001:db8:1:2::/64"},
		{name: "IPv6 proxy", cfg: lan, remote: "[2001:db8:ffff::1]:1", hdr: []string{xff, "203.0.113.7, 2001:db8:ffff::2"}, want: "203.0.113.7"},
		{name: "IPv4-mapped entry", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "::ffff:203.0.113.7"}, want: "203.0.113.7"},
		{name: "IPv4-mapped peer, IPv4 network", cfg: lan, remote: "[::ffff:10.0.0.1]:1", hdr: []string{xff, "203.0.113.7"}, want: "203.0.113.7"},
		{name: "IPv4-mapped network", cfg: guard.ClientIPConfig{TrustedProxies: prefixes("::ffff:10.0.0.0/104")}, remote: "10.0.0.1:1", hdr: []string{xff, "203.0.113.7"}, want: "203.0.113.7"},
		{name: "zone in entry", cfg: lan, remote: "10.0.0.1:1", hdr: []string{xff, "fe80::1%eth0"}, want: "fe80::/64"},
		{name: "other header ignored", cfg: lan, remote: "10.0.0.1:1", hdr: []string{"Forwarded", "for=198.51.100.1", xff, "203.0.113.7"}, want: "203.0.113.7"},
		{name: "X-Real-IP", cfg: guard.ClientIPConfig{TrustedProxies: lan.TrustedProxies, Header: "x-real-ip"}, remote: "10.0.0.1:1", hdr: []string{xff, "198.51.100.1", "X-Real-IP", "203.0.113.7"}, want: "203.0.113.7"},
		{name: "one hop", cfg: hops1, remote: "192.0.2.1:1", hdr: []string{xff, "198.51.100.9, 203.0.113.7"}, want: "203.0.113.7"},
		{name: "one hop, no header", cfg: hops1, remote: "192.0.2.1:1", want: "192.0.2.1"},
		{name: "one hop, malformed", cfg: hops1, remote: "192.0.2.1:1", hdr: []string{xff, "203.0.113.7:"}, want: "192.0.2.1"},
		{name: "one hop, unix socket", cfg: hops1, remote: "@", hdr: []string{xff, "203.0.113.7"}, want: "203.0.113.7"},
		{name: "one hop, unix socket, no header", cfg: hops1, remote: "@", err: guard.ErrNoKey},
		{name: "one hop, unix socket, malformed", cfg: hops1, remote: "@", hdr: []string{xff, "x"}, err: guard.ErrNoKey},
		{name: "two hops", cfg: guard.ClientIPConfig{TrustedHops: 2}, remote: "192.0.2.1:1", hdr: []string{xff, "198.51.100.9, 203.0.113.7, 192.0.2.2"}, want: "203.0.113.7"},
		{name: "hops then networks", cfg: guard.ClientIPConfig{TrustedHops: 1, TrustedProxies: prefixes("10.0.0.0/8")}, remote: "192.0.2.1:1", hdr: []string{xff, "198.51.100.9, 203.0.113.7, 10.0.0.2"}, want: "203.0.113.7"},
	})
}

func TestClientIPForwarded(t *testing.T) {
	const fwd = "Forwarded"
	cfg := guard.ClientIPConfig{TrustedProxies: lan.TrustedProxies, Header: "forwarded"}
	const peer = "10.0.0.1:1"
	runIPCases(t, fwdCases{
		{name: "RFC 7239 example", value: "for=192.0.2.60;proto=http;by=203.0.113.43", want: "192.0.2.60"},
		{name: "quoted IPv6 with port", value: `for="[2001:db8:cafe::17]:4711"`, want: "2001:db8:cafe::/64"},
		{name: "quoted IPv4 with port", value: `for="192.0.2.43:47011"`, want: "192.0.2.43"},
		{name: "obfuscated port", value: `for="[2001:db8:cafe::17]:_abc"`, want: "2001:db8:cafe::/64"},
		{name: "unquoted IPv6 in brackets", value: `for=[2001:db8:cafe::17]`, want: "2001:db8:cafe::/64"},
		{name: "parameter name case", value: "For=192.0.2.60", want: "192.0.2.60"},
		{name: "spaces", value: " for = 192.0.2.60 ", want: "10.0.0.1"},
		{name: "spaces around separators", value: "for=198.51.100.1 ; proto=https , for=192.0.2.60 ;by=10.0.0.1", want: "192.0.2.60"},
		{name: "elements", value: "for=198.51.100.1, for=192.0.2.60", want: "192.0.2.60"},
		{name: "proxy chain", value: "for=198.51.100.1, for=192.0.2.60, for=10.0.0.2", want: "192.0.2.60"},
		{name: "quoted comma to the left", value: `for=198.51.100.1;x="a,b", for=192.0.2.60`, want: "192.0.2.60"},
		{name: "empty elements", value: ", for=192.0.2.60,,", want: "192.0.2.60"},
		{name: "trailing semicolon", value: "for=192.0.2.60;", want: "192.0.2.60"},
		{name: "junk to the left", value: "for=1.2.3.4 junk;x, for=192.0.2.60", want: "192.0.2.60"},
		{name: "junk in a quoted string to the left", value: `for="1.2.3.4" junk";", for=192.0.2.60`, want: "192.0.2.60"},
		{name: "unknown", value: "for=192.0.2.60, for=unknown", want: "10.0.0.1"},
		{name: "unknown behind a trusted hop", value: "for=192.0.2.60, for=unknown, for=10.0.0.2", want: "10.0.0.2"},
		{name: "obfuscated", value: "for=192.0.2.60, for=_hidden", want: "10.0.0.1"},
		{name: "no for", value: "for=192.0.2.60, proto=https", want: "10.0.0.1"},
		{name: "for twice", value: "for=192.0.2.60;for=198.51.100.1", want: "10.0.0.1"},
		{name: "empty for", value: "for=", want: "10.0.0.1"},
		{name: "empty quoted for", value: `for=""`, want: "10.0.0.1"},
		{name: "unterminated quote swallows the proxy's element", value: `for="1.2.3.4, for=192.0.2.60`, want: "10.0.0.1"},
		{name: "escaped quote", value: `for="1.2.3.4\", for=192.0.2.60`, want: "10.0.0.1"},
		{name: "unbracketed IPv6 with port", value: `for="2001:db8::1:4711"`, want: "2001:db8::/64"},
		{name: "syntax error rightmost", value: "for=192.0.2.60, for", want: "10.0.0.1"},
		{name: "value with a quote", value: `for=192.0.2.60"x"`, want: "10.0.0.1"},
		{name: "header lines", lines: []string{"for=198.51.100.1", "for=192.0.2.60"}, want: "192.0.2.60"},
		{name: "broken line to the left", lines: []string{`for="198.51.100.1`, "for=192.0.2.60"}, want: "192.0.2.60"},
		{name: "X-Forwarded-For ignored", lines: []string{"for=192.0.2.60"}, xff: "198.51.100.1", want: "192.0.2.60"},
		{name: "X-Forwarded-For only", xff: "198.51.100.1", want: "10.0.0.1"},
	}.cases(cfg, peer, fwd))
}

// fwdCase is a Forwarded header: one line value, or lines, and an
// X-Forwarded-For line xff.
type fwdCase struct {
	name, value string
	lines       []string
	xff         string
	want        string
}

type fwdCases []fwdCase

func (fc fwdCases) cases(cfg guard.ClientIPConfig, peer, name string) []ipCase {
	var cs []ipCase
	for _, c := range fc {
		var hdr []string
		if c.value != "" {
			hdr = append(hdr, name, c.value)
		}
		for _, l := range c.lines {
			hdr = append(hdr, name, l)
		}
		if c.xff != "" {
			hdr = append(hdr, "X-Forwarded-For", c.xff)
		}
		cs = append(cs, ipCase{name: c.name, cfg: cfg, remote: peer, hdr: hdr, want: c.want})
	}
	return cs
}

// ClientIP copies its networks: changing the caller's slice later changes
// nothing.
func TestClientIPCopiesNetworks(t *testing.T) {
	ps := prefixes("10.0.0.0/8")
	key := guard.ClientIP(ps...)
	ps[0] = netip.MustParsePrefix("192.0.2.0/24")
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.0.0.1:1"
	r.Header.Set("X-Forwarded-For", "203.0.113.7")
	if got, err := key(r); err != nil || got != "203.0.113.7" {
		t.Fatalf("key = %q, %v; want 203.0.113.7", got, err)
	}
}

func TestClientIPAddr(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.0.0.1:1"
	r.Header.Set("X-Forwarded-For", "[2001:db8:1:2::99%eth0]:80")
	a, err := lan.Addr(r)
	if want := netip.MustParseAddr("2001:db8:1:2::99"); err != nil || a != want {
		t.Fatalf("Addr = %v, %v; want %v", a, err, want)
	}
}
