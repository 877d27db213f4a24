package main

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
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

// server returns a server of h with the limits. net/http answers a header
// block over MaxHeaderBytes (plus its own 4 KiB of slack) with 431 and
// closes the connection; a request not read within Read fails the
// handler's body read, and the connection is closed.
func (l serverLimits) server(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read,
		WriteTimeout: l.Write, IdleTimeout: l.Idle, MaxHeaderBytes: l.MaxHeaderBytes}
}
