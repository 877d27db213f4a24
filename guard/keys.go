package guard

import (
	"fmt"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
)

// A KeyFunc derives the key a request is limited under (its client's
// address, a phone number in its body, its route): Middleware's argument.
// This package's KeyFuncs keep no state and are safe for concurrent use;
// those that read the body give it back intact. Their errors match
// ErrNoKey, ErrBodyTooLarge or ErrContentType and are RequestErrors, whose
// Fix Middleware answers with. A KeyFunc of yours may return one too.
type KeyFunc func(*http.Request) (string, error)

// Header returns a KeyFunc that keys on the value of the request header
// name, trimmed of white space; Header("Host") reads r.Host. A header that
// is missing, empty or given in more than one line is an error matching
// ErrNoKey. A client writes its own headers: key only on one it cannot
// choose freely (an API key checked later) or that a trusted proxy sets.
func Header(name string) KeyFunc {
	name = textproto.CanonicalMIMEHeaderKey(name)
	what := "header " + name
	return func(r *http.Request) (string, error) {
		vs := r.Header.Values(name)
		if name == "Host" {
			vs = []string{r.Host}
		}
		if len(vs) == 1 {
			vs = []string{strings.TrimSpace(vs[0])}
		}
		return single(vs, what)
	}
}

// Query returns a KeyFunc that keys on the URL query parameter name, as
// r.URL.Query decodes it ('+' is a space: send a plus as %2B). A parameter
// missing, empty or given twice, or a query that does not parse, is an
// error matching ErrNoKey. It never reads the body.
func Query(name string) KeyFunc {
	what := fmt.Sprintf("query parameter %q", name)
	return func(r *http.Request) (string, error) {
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			return "", fixable(ErrNoKey, "malformed query string")
		}
		return single(q[name], what)
	}
}

// single is the one non-empty value in vs, the values of what.
func single(vs []string, what string) (string, error) {
	switch {
	case len(vs) == 0:
		return "", fixable(ErrNoKey, "missing "+what)
	case len(vs) > 1:
		return "", fixable(ErrNoKey, what+" given more than once")
	case vs[0] == "":
		return "", fixable(ErrNoKey, "empty "+what)
	}
	return vs[0], nil
}

// Route is a KeyFunc that keys on the method and the http.ServeMux pattern
// that matched ("POST /users/{id}/send"; a pattern's own method wins, so
// HEAD routed to "GET /x" is "GET /x"). Wrap the handler registered in the
// mux, not the mux: without r.Pattern Route keys on r.URL.Path, a key per
// path any client can spell. Route is never an error.
func Route(r *http.Request) (string, error) {
	if p := r.Pattern; p != "" {
		// ServeMux separates the method from the rest at the first space
		// or tab.
		if i := strings.IndexAny(p, " \t"); i >= 0 {
			return p[:i] + " " + strings.TrimLeft(p[i:], " \t"), nil
		}
		return r.Method + " " + p, nil
	}
	return r.Method + " " + r.URL.Path, nil
}

// Join returns a KeyFunc that keys on the keys of all parts together, as
// JoinKeys joins them: Join(Route, ClientIP()) limits per route and client.
// The first error of a part is Join's. Without parts, or with a nil one,
// every call fails with ErrInvalidKeyFunc.
func Join(parts ...KeyFunc) KeyFunc {
	if len(parts) == 0 || slices.ContainsFunc(parts, func(f KeyFunc) bool { return f == nil }) {
		return badKeyFunc("Join without parts, or with a nil part")
	}
	parts = slices.Clone(parts)
	return func(r *http.Request) (string, error) {
		keys := make([]string, len(parts))
		for i, part := range parts {
			k, err := part(r)
			if err != nil {
				return "", err
			}
			keys[i] = k
		}
		return JoinKeys(keys...), nil
	}
}

// JoinKeys is the key of keys together: each with '\' and '|' escaped by a
// '\', joined with '|' ("POST /send|203.0.113.7"), so two different lists
// never make one key. Key functions of other transports (grpcguard) use it.
func JoinKeys(keys ...string) string {
	escaped := make([]string, len(keys))
	for i, k := range keys {
		escaped[i] = keyEscaper.Replace(k)
	}
	return strings.Join(escaped, "|")
}

var keyEscaper = strings.NewReplacer(`\`, `\\`, `|`, `\|`)

// badKeyFunc is the KeyFunc of a constructor given bad arguments: every call
// fails with ErrInvalidKeyFunc, which Middleware answers with 500.
func badKeyFunc(why string) KeyFunc {
	err := fmt.Errorf("%w: %s", ErrInvalidKeyFunc, why)
	return func(*http.Request) (string, error) { return "", err }
}
