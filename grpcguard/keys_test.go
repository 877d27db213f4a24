package grpcguard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/grpcguard"
	"github.com/funnelguard/funnelguard/guard"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

func prefixes(s ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, p := range s {
		ps = append(ps, netip.MustParsePrefix(p))
	}
	return ps
}

// tcpAddr is a peer address as its String.
type tcpAddr string

func (a tcpAddr) Network() string { return "tcp" }
func (a tcpAddr) String() string  { return string(a) }

// ipCase is a call from the peer remote ("" for none) with the metadata
// md (name, value, ...), and the key cfg should give: want, or an error
// matching err.
type ipCase struct {
	name   string
	cfg    guard.ClientIPConfig
	remote string
	md     []string
	want   string
	err    error
}

// callContext is the server context of a call from remote with md.
func callContext(remote string, md []string) context.Context {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(md...))
	if remote == "" {
		return ctx
	}
	return peer.NewContext(ctx, &peer.Peer{Addr: tcpAddr(remote)})
}

// httpKey is the key guard's ClientIPConfig gives an HTTP request from
// remote with md as its header lines.
func httpKey(c ipCase) (string, error) {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.RemoteAddr = c.remote
	for i := 0; i+1 < len(c.md); i += 2 {
		r.Header.Add(c.md[i], c.md[i+1])
	}
	return c.cfg.Key(r)
}

var lan = guard.ClientIPConfig{TrustedProxies: prefixes("10.0.0.0/8", "2001:db8:ffff::/48")}

// PeerAddr walks the peer and the forwarding metadata as guard walks
// RemoteAddr and the forwarding header: the cases of guard's own tests,
// each checked against the expected key and against guard on the same
// input.
func TestPeerAddr(t *testing.T) {
	const xff = "x-forwarded-for"
	hops1 := guard.ClientIPConfig{TrustedHops: 1}
	fwd := guard.ClientIPConfig{TrustedProxies: lan.TrustedProxies, Header: "Forwarded"}
	cases := []ipCase{
		{name: "IPv4", remote: "203.0.113.7:4711", want: "203.0.113.7"},
		{name: "IPv6 by /64", remote: "[2001:db8:1:2:3:4:5:6]:443", want: "2001:db8:1:2::/64"},
		{name: "IPv6 /128", cfg: guard.ClientIPConfig{IPv6PrefixLen: 128}, remote: "[2001:db8:1:2::1]:1", want: "2001:db8:1:2::1/128"},
		{name: "IPv6 prefix length over 128", cfg: guard.ClientIPConfig{IPv6PrefixLen: 129}, remote: "[2001:db8::1]:1", err: errAny},
		{name: "IPv4-mapped", remote: "[::ffff:203.0.113.7]:4711", want: "203.0.113.7"},
		{name: "zone", remote: "[fe80::1%eth0]:4711", want: "fe80::/64"},
		{name: "no peer", err: guard.ErrNoKey},
		{name: "in-memory peer", remote: "bufconn", err: guard.ErrNoKey},
		{name: "unix socket", remote: "@", err: guard.ErrNoKey},
		{name: "untrusted peer", remote: "203.0.113.7:1", md: []string{xff, "198.51.100.1"}, want: "203.0.113.7"},
		{name: "no trusted networks", remote: "10.0.0.1:1", md: []string{xff, "198.51.100.1"}, want: "10.0.0.1"},
		{name: "one proxy", cfg: lan, remote: "10.0.0.1:1", md: []string{xff, "203.0.113.7"}, want: "203.0.113.7"},
		{name: "spoofed entries to the left", cfg: lan, remote: "10.0.0.1:1", md: []string{xff, "1.2.3.4, 198.51.100.9, 203.0.113.7"}, want: "203.0.113.7"},
		{name: "spoofed trusted address to the left", cfg: lan, remote: "10.0.0.1:1", md: []string{xff, "10.9.9.9, 203.0.113.7"}, want: "203.0.113.7"},
		{name: "proxy chain", cfg: lan, remote: "10.0.0.1:1", md: []string{xff, "198.51.100.9, 203.0.113.7, 10.0.0.3, 10.0.0.2"}, want: "203.0.113.7"},
		{name: "chain across values", cfg: lan, remote: "10.0.0.1:1", md: []string{xff, "1.2.3.4, 203.0.113.7", xff, "10.0.0.2"}, want: "203.0.113.7"},
		{name: "all trusted", cfg: lan, remote: "10.0.0.1:1", md: []string{xff, "10.0.0.3, 10.0.0.2"}, want: "10.0.0.3"},
		{name: "trusted peer, no metadata", cfg: lan, remote: "10.0.0.1:1", want: "10.0.0.1"},
		{name: "malformed rightmost", cfg: lan, remote: "10.0.0.1:1", md: []string{xff, "203.0.113.7, garbage"}, want: "10.0.0.1"},
		{name: "unknown behind a trusted hop", cfg: lan, remote: "10.0.0.1:1", md: []string{xff, "203.0.113.7, unknown, 10.0.0.2"}, want: "10.0.0.2"},
		{name: "IPv6 entry", cfg: lan, remote: "10.0.0.1:1", md: []string{xff, "[2001:db8:1:2::99]:4711"}, want: "2001:db8:1:2::/64"},
		{name: "IPv6 proxy", cfg: lan, remote: "[2001:db8:ffff::1]:1", md: []string{xff, "203.0.113.7, 2001:db8:ffff::2"}, want: "203.0.113.7"},
		{name: "IPv4-mapped peer, IPv4 network", cfg: lan, remote: "[::ffff:10.0.0.1]:1", md: []string{xff, "203.0.113.7"}, want: "203.0.113.7"},
		{name: "other metadata ignored", cfg: lan, remote: "10.0.0.1:1", md: []string{"forwarded", "for=198.51.100.1", xff, "203.0.113.7"}, want: "203.0.113.7"},
		{name: "x-real-ip", cfg: guard.ClientIPConfig{TrustedProxies: lan.TrustedProxies, Header: "X-Real-IP"}, remote: "10.0.0.1:1", md: []string{xff, "198.51.100.1", "x-real-ip", "203.0.113.7"}, want: "203.0.113.7"},
		{name: "one hop", cfg: hops1, remote: "192.0.2.1:1", md: []string{xff, "198.51.100.9, 203.0.113.7"}, want: "203.0.113.7"},
		{name: "one hop, unix socket", cfg: hops1, remote: "@", md: []string{xff, "203.0.113.7"}, want: "203.0.113.7"},
		{name: "two hops", cfg: guard.ClientIPConfig{TrustedHops: 2}, remote: "192.0.2.1:1", md: []string{xff, "198.51.100.9, 203.0.113.7, 192.0.2.2"}, want: "203.0.113.7"},
		{name: "Forwarded", cfg: fwd, remote: "10.0.0.1:1", md: []string{"forwarded", "for=198.51.100.1, for=192.0.2.60;proto=http"}, want: "192.0.2.60"},
		{name: "Forwarded, quoted IPv6", cfg: fwd, remote: "10.0.0.1:1", md: []string{"forwarded", `for="[2001:db8:cafe::17]:4711"`}, want: "2001:db8:cafe::/64"},
		{name: "Forwarded, unknown", cfg: fwd, remote: "10.0.0.1:1", md: []string{"forwarded", "for=192.0.2.60, for=unknown"}, want: "10.0.0.1"},
		{name: "Forwarded, x-forwarded-for ignored", cfg: fwd, remote: "10.0.0.1:1", md: []string{xff, "198.51.100.1"}, want: "10.0.0.1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := grpcguard.PeerAddr(c.cfg)(callContext(c.remote, c.md), "/test.Echo/Say")
			if c.err != nil {
				if err == nil || (c.err != errAny && !errors.Is(err, c.err)) {
					t.Fatalf("key = %q, %v; want an error matching %v", got, err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("key = %q, %v; want %q", got, err, c.want)
			}
			if hk, herr := httpKey(c); hk != got || herr != nil {
				t.Fatalf("guard keys the same HTTP request %q, %v; PeerAddr %q", hk, herr, got)
			}
		})
	}
}

// errAny in an ipCase wants an error, whichever.
var errAny = errors.New("any error")

// PeerAddr copies its networks: changing the caller's slice later changes
// nothing.
func TestPeerAddrCopiesNetworks(t *testing.T) {
	cfg := guard.ClientIPConfig{TrustedProxies: prefixes("10.0.0.0/8")}
	key := grpcguard.PeerAddr(cfg)
	cfg.TrustedProxies[0] = netip.MustParsePrefix("192.0.2.0/24")
	got, err := key(callContext("10.0.0.1:1", []string{"x-forwarded-for", "203.0.113.7"}), "")
	if err != nil || got != "203.0.113.7" {
		t.Fatalf("key = %q, %v; want 203.0.113.7", got, err)
	}
}

func TestMetadata(t *testing.T) {
	ctx := callContext("", []string{"x-api-key", "k1", "x-api-key", "k2", "x-empty", ""})
	if got, err := grpcguard.Metadata("X-Api-Key")(ctx, ""); err != nil || got != "k1" {
		t.Fatalf("key = %q, %v; want the first value k1", got, err)
	}
	for _, name := range []string{"x-missing", "x-empty"} {
		_, err := grpcguard.Metadata(name)(ctx, "")
		if re, ok := errors.AsType[*guard.RequestError](err); !errors.Is(err, guard.ErrNoKey) || !ok || !strings.Contains(re.Fix, name) {
			t.Fatalf("%s: error %v; want a RequestError matching ErrNoKey naming it", name, err)
		}
	}
	if _, err := grpcguard.Metadata("")(ctx, ""); !errors.Is(err, guard.ErrInvalidKeyFunc) {
		t.Fatalf("Metadata(\"\") error %v; want ErrInvalidKeyFunc", err)
	}
	if _, err := grpcguard.Metadata("x-api-key")(context.Background(), ""); !errors.Is(err, guard.ErrNoKey) {
		t.Fatalf("without metadata: error %v; want ErrNoKey", err)
	}
}

func TestFullMethod(t *testing.T) {
	if got, err := grpcguard.FullMethod()(context.Background(), "/a.B/C"); err != nil || got != "/a.B/C" {
		t.Fatalf("key = %q, %v", got, err)
	}
	if _, err := grpcguard.FullMethod()(context.Background(), ""); !errors.Is(err, guard.ErrNoKey) {
		t.Fatalf("empty method: error %v; want ErrNoKey", err)
	}
}

// Join encodes its parts' keys as guard.Join does, so that no two lists of
// keys make one key.
func TestJoin(t *testing.T) {
	lists := [][]string{{"a", "b"}, {"a|b"}, {`a\`, "b"}, {`a\|b`}, {"", "|"}, {"|", ""}, {`\\`, `\`}}
	seen := map[string][]string{}
	for _, keys := range lists {
		var parts []grpcguard.KeyFunc
		var hparts []guard.KeyFunc
		for _, k := range keys {
			parts = append(parts, func(context.Context, string) (string, error) { return k, nil })
			hparts = append(hparts, func(*http.Request) (string, error) { return k, nil })
		}
		got, err := grpcguard.Join(parts...)(context.Background(), "")
		want, _ := guard.Join(hparts...)(httptest.NewRequest(http.MethodGet, "/", nil))
		if err != nil || got != want {
			t.Fatalf("Join(%q) = %q, %v; guard.Join %q", keys, got, err, want)
		}
		if prev, dup := seen[got]; dup {
			t.Fatalf("Join(%q) and Join(%q) both %q", prev, keys, got)
		}
		seen[got] = keys
	}
	_, err := grpcguard.Join(grpcguard.FullMethod(), grpcguard.Metadata("x"))(context.Background(), "/m")
	if !errors.Is(err, guard.ErrNoKey) {
		t.Fatalf("a failing part: error %v; want its ErrNoKey", err)
	}
	for name, j := range map[string]grpcguard.KeyFunc{"no parts": grpcguard.Join(), "nil part": grpcguard.Join(grpcguard.FullMethod(), nil)} {
		if _, err := j(context.Background(), "/m"); !errors.Is(err, guard.ErrInvalidKeyFunc) {
			t.Fatalf("%s: error %v; want ErrInvalidKeyFunc", name, err)
		}
	}
}
