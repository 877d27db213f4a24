package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// serverLimits bound what one client's connection may hold: the time to
// send its request (header, then header and body), to take the answer, to
// sit idle between requests, and the size of its header block. net/http
// bounds none of them by default (its header limit is 1 MiB), so a body sent
// one byte a second holds a connection and a handler for as long as the
// client likes.
type serverLimits struct {
	ReadHeader     time.Duration // request line and header
	Read           time.Duration // header and body, from the first byte of the request
	Write          time.Duration // from the end of the header to the end of the answer
	Idle           time.Duration // between two requests of a kept-alive connection
	MaxHeaderBytes int           // request line and header; more is answered 431
}

// defaultServerLimits returns the limits the service runs with:
//
//   - 5 s for the header: a legitimate one (a few hundred bytes, a few KiB of
//     cookies) arrives in one round trip on any network that can use the page.
//   - 10 s for header and body: the API's bodies are under 4 KiB, so a
//     request still arriving after 10 s is a trickle, not a slow phone.
//   - 15 s to answer: a send runs several Redis calls (each within
//     -redis-timeout, 500 ms) and the provider's (-provider-timeout, 5 s);
//     the answer must get out within this, or the client sees a reset
//     where a 502 was due.
//   - 60 s idle: the page's few requests reuse the connection; idle
//     browsers then give it back.
//   - 16 KiB of header: the API needs a few hundred bytes; 16 KiB leaves
//     room for a domain's cookies (nginx refuses a header line over 8 KiB),
//     and is 1/64 of net/http's 1 MiB.
func defaultServerLimits() serverLimits {
	return serverLimits{ReadHeader: 5 * time.Second, Read: 10 * time.Second, Write: 15 * time.Second,
		Idle: 60 * time.Second, MaxHeaderBytes: 16 << 10}
}

// flags registers the limits' flags on fl, with l's values as defaults.
func (l *serverLimits) flags(fl *flag.FlagSet) {
	fl.DurationVar(&l.ReadHeader, "read-header-timeout", l.ReadHeader, "time a client has to send a request's header")
	fl.DurationVar(&l.Read, "read-timeout", l.Read, "time a client has to send a whole request, header and body (a slower one is cut)")
	fl.DurationVar(&l.Write, "write-timeout", l.Write, "time from a request's header to the end of its answer; must exceed -provider-timeout plus -provider-inflight-wait")
	fl.DurationVar(&l.Idle, "idle-timeout", l.Idle, "time a kept-alive connection may sit idle")
	fl.IntVar(&l.MaxHeaderBytes, "max-header-bytes", l.MaxHeaderBytes, "size of a request's header block; a larger one is answered 431")
}

// errServerLimits is the error, matched with errors.Is, of limits that
// check refuses.
var errServerLimits = errors.New("invalid server limits")

// check refuses limits that are not positive, or a write time-out that the
// provider's time-out, a part of every send, would outlast, with the wait
// for a provider call to end (-provider-inflight-wait, 0 when the calls are
// not bounded): the client would see its connection cut instead of the 502.
func (l serverLimits) check(providerTimeout, inFlightWait time.Duration) error {
	if l.ReadHeader <= 0 || l.Read <= 0 || l.Write <= 0 || l.Idle <= 0 || l.MaxHeaderBytes <= 0 {
		return fmt.Errorf("%w: -read-header-timeout, -read-timeout, -write-timeout, -idle-timeout and -max-header-bytes must be positive", errServerLimits)
	}
	// A provider time-out that is not positive is Config.check's to refuse.
	if providerTimeout > 0 && l.Write <= providerTimeout+inFlightWait {
		return fmt.Errorf("%w: -write-timeout %v must exceed -provider-timeout %v plus -provider-inflight-wait %v", errServerLimits, l.Write, providerTimeout, inFlightWait)
	}
	return nil
}

// server returns a server of h with the limits, to serve on listener(ln).
// net/http answers a header block over MaxHeaderBytes (plus its own 4 KiB
// of slack) with 431 and closes the connection; a request not read within Read fails the
// handler's body read, and the connection is closed.
func (l serverLimits) server(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read,
		WriteTimeout: l.Write, IdleTimeout: l.Idle, MaxHeaderBytes: l.MaxHeaderBytes}
}

// listener returns ln whose connections answer in JSON the requests that
// net/http refuses before any handler sees them: a header block over
// MaxHeaderBytes (431), and a request it cannot read (400, 501, 505).
// net/http writes those answers itself, in plain text, straight to the
// connection, so no handler or middleware can change them. A middleware
// could answer 431 in JSON only if MaxHeaderBytes were raised above the
// limit, and a header block past that raised limit would still get the
// plain text; rewriting net/http's one canned write keeps its limit exact
// and every answer JSON. The rewrite matches the whole canned answer
// (status line, then exactly net/http's text/plain header and Connection:
// close, then the status again as the body), which no answer of a handler
// matches: net/http adds a Date header to every one of those.
func (l serverLimits) listener(ln net.Listener) net.Listener {
	return refusalListener{Listener: ln, maxHeader: l.MaxHeaderBytes}
}

type refusalListener struct {
	net.Listener
	maxHeader int
}

func (l refusalListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &refusalConn{Conn: c, maxHeader: l.maxHeader}, nil
}

// refusalConn is a connection whose writes of net/http's canned refusals
// are written as JSON answers.
type refusalConn struct {
	net.Conn
	maxHeader int
}

func (c *refusalConn) Write(p []byte) (int, error) {
	j := jsonRefusal(p, c.maxHeader)
	if j == nil {
		return c.Conn.Write(p)
	}
	if _, err := c.Conn.Write(j); err != nil {
		return 0, err
	}
	return len(p), nil
}

// CloseWrite lets net/http half-close the connection after a 431, as it
// does on a bare TCP connection, so that the client reads the answer
// before the connection is reset.
func (c *refusalConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// cannedHeader is the header of net/http's canned answers (net/http
// server.go, errorHeaders).
const cannedHeader = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// jsonRefusal returns p, if it is one of net/http's canned answers ("HTTP/1.1
// 431 Request Header Fields Too Large" cannedHeader "431 Request Header
// Fields Too Large"), as a JSON answer of the same status; nil otherwise.
func jsonRefusal(p []byte, maxHeader int) []byte {
	const proto = "HTTP/1.1 "
	line, body, ok := bytes.Cut(p, []byte(cannedHeader))
	if !ok || !bytes.HasPrefix(line, []byte(proto)) || bytes.ContainsAny(line, "\r\n") || len(line) < len(proto)+4 {
		return nil
	}
	status, err := strconv.Atoi(string(line[len(proto) : len(proto)+3]))
	if err != nil || !bytes.HasPrefix(body, line[len(proto):len(proto)+4]) {
		return nil
	}
	// "Bad Request: missing required Host header": "bad request: missing..."
	text := http.StatusText(status)
	msg := strings.ToLower(text) + strings.TrimPrefix(string(body[4:]), text)
	if status == http.StatusRequestHeaderFieldsTooLarge {
		msg = fmt.Sprintf("request header fields too large: the request line and header may have %d bytes (-max-header-bytes)", maxHeader)
	}
	j, _ := json.Marshal(reply{Error: msg})
	j = append(j, '\n')
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"+
		"Connection: close\r\nContent-Length: %d\r\n\r\n", line, len(j))
	b.Write(j)
	return b.Bytes()
}
