package grpcguard

import (
	"context"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strings"

	"github.com/funnelguard/funnelguard/guard"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// A KeyFunc derives the key a call is limited under from its context (the
// peer, the incoming metadata) and its full method name
// ("/package.Service/Method"). The KeyFuncs of this package keep no state
// and are safe for concurrent use. Their errors match guard.ErrNoKey (the
// call carries no usable key) or guard.ErrInvalidKeyFunc (the KeyFunc was
// built from bad arguments) and are *guard.RequestError values whose Fix
// says what the client can fix without quoting what it sent.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// FullMethod returns a KeyFunc that keys on the call's full method name
// ("/sms.Sender/Send"), so that every caller of a method shares one key. An
// empty method name (a Limiter used on the client side) is an error
// matching guard.ErrNoKey.
func FullMethod() KeyFunc {
	return func(_ context.Context, fullMethod string) (string, error) {
		if fullMethod == "" {
			return "", fixable(guard.ErrNoKey, "the method is unknown")
		}
		return fullMethod, nil
	}
}

// Metadata returns a KeyFunc that keys on the first value of the incoming
// metadata name (an API key, a tenant), matched without regard to case as
// gRPC metadata keys are. A missing or empty first value is an error
// matching guard.ErrNoKey; an empty name makes every call fail with
// guard.ErrInvalidKeyFunc.
//
// A client writes its own metadata: key only on metadata that the client
// cannot choose freely (an API key checked later) or that a trusted proxy
// sets, replacing whatever the client sent.
func Metadata(name string) KeyFunc {
	if name == "" {
		return badKeyFunc("Metadata without a name")
	}
	name = strings.ToLower(name)
	fix := fmt.Sprintf("missing metadata %q", name)
	return func(ctx context.Context, _ string) (string, error) {
		vs := metadata.ValueFromIncomingContext(ctx, name)
		if len(vs) == 0 || vs[0] == "" {
			return "", fixable(guard.ErrNoKey, fix)
		}
		return vs[0], nil
	}
}

// PeerAddr returns a KeyFunc that keys on the client's address as cfg
// says (see guard.ClientIPConfig): the address of the call's peer
// (google.golang.org/grpc/peer) and, when the peer is a trusted proxy
// (cfg.TrustedProxies, cfg.TrustedHops), the forwarding metadata cfg.Header
// names ("x-forwarded-for" when empty), walked from the right exactly as
// guard walks the X-Forwarded-For header: the key is the rightmost
// untrusted hop. Without trusted proxies the metadata, which the client
// writes, is never read. IPv4 addresses key as themselves, IPv6 ones by
// their network of cfg.IPv6PrefixLen bits (/64 by default). cfg's networks
// are copied.
//
// A peer without an IP address (an in-memory or Unix socket connection
// without trusted hops) is an error matching guard.ErrNoKey.
func PeerAddr(cfg guard.ClientIPConfig) KeyFunc {
	cfg.TrustedProxies = slices.Clone(cfg.TrustedProxies)
	name := cfg.Header
	if name == "" {
		name = "X-Forwarded-For"
	}
	header, md := textproto.CanonicalMIMEHeaderKey(name), strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", fixable(guard.ErrNoKey, "the client's address is unknown")
		}
		// guard.ClientIPConfig reads a request's RemoteAddr and its
		// forwarding header lines, and nothing else: a request holding only
		// those makes it walk the call's peer and metadata, one walk for
		// both transports.
		r := &http.Request{RemoteAddr: p.Addr.String(), Header: http.Header{}}
		for _, v := range metadata.ValueFromIncomingContext(ctx, md) {
			r.Header.Add(header, v)
		}
		return cfg.Key(r)
	}
}

// Join returns a KeyFunc that keys on the keys of all parts together, such
// as Join(FullMethod(), Metadata("x-api-key")) for a limit per method and
// client, encoded as guard.Join encodes them: each key has its '\' and '|'
// escaped with a '\', and they are joined with '|', so that two different
// lists of keys never make the same key. The first error of a part is
// Join's. Join without parts or with a nil part returns a KeyFunc whose
// every call fails with guard.ErrInvalidKeyFunc.
func Join(parts ...KeyFunc) KeyFunc {
	if len(parts) == 0 {
		return badKeyFunc("Join without parts")
	}
	for _, p := range parts {
		if p == nil {
			return badKeyFunc("Join with a nil part")
		}
	}
	parts = slices.Clone(parts)
	return func(ctx context.Context, fullMethod string) (string, error) {
		keys := make([]string, len(parts))
		for i, p := range parts {
			k, err := p(ctx, fullMethod)
			if err != nil {
				return "", err
			}
			keys[i] = k
		}
		return guard.JoinKeys(keys...), nil
	}
}

// badKeyFunc is a KeyFunc built from bad arguments: a bug of the server.
func badKeyFunc(why string) KeyFunc {
	err := fixable(fmt.Errorf("%w: %s", guard.ErrInvalidKeyFunc, why), "invalid key function")
	return func(context.Context, string) (string, error) { return "", err }
}

// fixable is a RequestError for the client with the fix fix and the
// server's error err.
func fixable(err error, fix string) error {
	return &guard.RequestError{Fix: fix, Err: err}
}
