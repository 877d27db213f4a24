package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
)

// The operators' tools: a JSON API and a page for the people who run the
// service (a support desk, an operator), on an address of their own
// (-admin-addr), behind a bearer token. See README.md.

// adminConfig is the tools' flags.
type adminConfig struct {
	addr        string
	token       string
	allowRemote bool
}

// minAdminToken is the shortest bearer token the tools accept, in bytes.
const minAdminToken = 16

// adminFlags binds the tools' flags.
func adminFlags(fl *flag.FlagSet) *adminConfig {
	a := &adminConfig{}
	fl.StringVar(&a.addr, "admin-addr", "", "serve the operators' tools (JSON API and page) on this address, "+
		"a loopback one unless -admin-allow-remote (default: off)")
	// Not os.Getenv as the default: -h would print the token.
	fl.StringVar(&a.token, "admin-token", "", "the operators' tools' bearer token, 16+ bytes "+
		"(default $SMS_ADMIN_TOKEN; prefer the variable: a flag shows in process listings)")
	fl.BoolVar(&a.allowRemote, "admin-allow-remote", false, "let -admin-addr be an address other machines reach "+
		"(put TLS in front: every request carries the token)")
	return a
}

// check takes the token from $SMS_ADMIN_TOKEN when no flag gives it, and
// refuses tools without a token, or, without allowRemote, on an
// address that is not loopback (by name: localhost, 127.0.0.1, [::1]; an
// empty host is every interface).
func (a *adminConfig) check() error {
	if a.addr == "" {
		return nil
	}
	if a.token == "" {
		a.token = os.Getenv("SMS_ADMIN_TOKEN")
	}
	if len(a.token) < minAdminToken {
		return fmt.Errorf("%w: -admin-addr needs a bearer token of at least %d bytes: set $SMS_ADMIN_TOKEN (or -admin-token, "+
			"which shows in process listings)", errConfig, minAdminToken)
	}
	host, _, err := net.SplitHostPort(a.addr)
	if err != nil {
		return fmt.Errorf("%w: -admin-addr %q: %w", errConfig, a.addr, err)
	}
	if ip := net.ParseIP(host); !a.allowRemote && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("%w: -admin-addr %q is not a loopback address (such as 127.0.0.1:9090): "+
			"the operators' tools reset limits; pass -admin-allow-remote to serve them to other machines", errConfig, a.addr)
	}
	return nil
}

// listen returns the tools' listener, nil when they are off.
func (a *adminConfig) listen() (net.Listener, error) {
	if a.addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", a.addr)
	if err == nil && !a.allowRemote && !loopback(ln.Addr()) { // localhost resolved elsewhere
		ln.Close()
		return nil, fmt.Errorf("%w: -admin-addr %q listens on %s, not loopback", errConfig, a.addr, ln.Addr())
	}
	return ln, err
}

// AdminHandler returns the operators' tools: the API under /api/, which
// answers only requests with the bearer token, and the page, which holds
// no data and asks for the token.
func (s *Service) AdminHandler(token string) http.Handler {
	api := http.NewServeMux()
	api.HandleFunc("GET /api/number", s.adminNumber)
	api.HandleFunc("POST /api/number/reset", s.adminReset)
	api.HandleFunc("GET /api/prefixes", s.adminPrefixes)
	api.HandleFunc("POST /api/prefixes/resume", s.adminResume)
	api.HandleFunc("GET /api/budget", s.adminBudget)
	api.HandleFunc("GET /api/spend", s.adminSpend)
	api.HandleFunc("GET /api/pools", s.adminPools)
	mux := http.NewServeMux()
	mux.Handle("/api/", bearer(token, s, jsonErrors(api)))
	page, err := fs.Sub(webFS, "web/admin")
	if err != nil {
		panic(err) // the embedded tree always has web/admin
	}
	files := http.FileServerFS(page)
	for _, p := range []string{"/{$}", "/admin.js", "/admin.css"} {
		mux.Handle("GET "+p, files)
	}
	return secured(jsonErrors(mux))
}

// bearer answers 401, and nothing more, to a request without
// "Authorization: Bearer <token>". The token is compared by its SHA-256, in
// constant time: neither its bytes nor its length show in the time taken.
func bearer(token string, s *Service, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		scheme, got, _ := strings.Cut(h, " ")
		sum := sha256.Sum256([]byte(got))
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			s.log.Warn("admin: request refused: no valid token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="sms admin"`)
			writeJSON(w, http.StatusUnauthorized, reply{Error: "unauthorized"})
			return
		}
		next.ServeHTTP(w, r)
	})
}
