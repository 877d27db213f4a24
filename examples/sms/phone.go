package main

import (
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/guard/phonekey"
	"github.com/nyaruka/phonenumbers"
)

// errInvalidCountry reports a request's country that is not a region with
// phone numbers; a number that is not one is phonekey.ErrInvalidNumber.
var errInvalidCountry = errors.New("invalid country")

// parsePhone returns number in E.164, and parsed, so that every spelling of one
// number ("138 0013 8000", "+86 138-0013-8000", "008613800138000", full-width
// digits) shares one bucket; region is used for numbers without a country.
// It is phonekey.Parse, the guard's own reading of a number: input with
// anything but the characters of a written number is refused, not dug out
// ("tel:+44…", "1-800-FLOWERS"), and so is a number not valid in its
// country's numbering plan. Its error is phonekey's, a guard.RequestError
// whose Fix says why and how to write the number, without quoting it.
func parsePhone(number, region string) (string, *phonenumbers.PhoneNumber, error) {
	n, err := phonekey.Parse(number, region)
	if err != nil {
		return "", nil, err
	}
	return phonenumbers.Format(n, phonenumbers.E164), n, nil
}

// maskPhone keeps the country code and the last 4 digits, for logs.
func maskPhone(e164 string) string {
	if len(e164) < 8 {
		return "***"
	}
	return e164[:3] + strings.Repeat("*", len(e164)-7) + e164[len(e164)-4:]
}

// parseHost parses "ip" or "ip:port" or "[ipv6]:port"; nil if it is neither.
func parseHost(host string) net.IP {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return net.ParseIP(host)
}

// clientIP returns the client's address as a rate-limit key: an IPv4
// address, or the /64 network of an IPv6 one (one subscriber's block). With
// trustProxy the peer is a proxy, and the client is the address it saw: the
// rightmost X-Forwarded-For entry, entries to its left being whatever the
// client wrote (see guard.ClientIPConfig).
func clientIP(r *http.Request, trustProxy bool) string {
	var ip guard.ClientIPConfig
	if trustProxy {
		ip.TrustedHops = 1
	}
	key, err := ip.Key(r)
	if err != nil {
		return "unknown" // no address (a Unix socket): such requests share a key
	}
	return key
}
