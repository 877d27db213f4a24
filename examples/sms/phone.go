package main

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"unicode"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/nyaruka/phonenumbers"
)

var errInvalidPhone = errors.New("invalid phone number")

// parsePhone returns number in E.164, and parsed, so that every spelling of one
// number ("138 0013 8000", "+86 138-0013-8000", "008613800138000", full-width
// digits) shares one bucket; region is used for numbers without a country.
// Only the characters of a spelling are accepted (see phoneRune):
// phonenumbers digs a number out of anything around it ("\r\n+44…",
// "a{b}c+44…", "[+44…]", "+44…*", "tel:+44…", "1-800-FLOWERS"), and such
// input is refused, not repaired.
func parsePhone(number, region string) (string, *phonenumbers.PhoneNumber, error) {
	if len(number) == 0 || len(number) > 64 || strings.IndexFunc(number, func(r rune) bool { return !phoneRune(r) }) >= 0 {
		return "", nil, errInvalidPhone
	}
	n, err := phonenumbers.Parse(number, region)
	if err != nil || !phonenumbers.IsValidNumber(n) {
		return "", nil, errInvalidPhone
	}
	return phonenumbers.Format(n, phonenumbers.E164), n, nil
}

// phoneRune reports whether r may appear in a phone number as people write
// it: a digit of any script (full-width ones too), a plus, a space, or the
// punctuation between groups, - . ( ), in ASCII or full width.
func phoneRune(r rune) bool {
	switch r {
	case '+', '\uff0b', // plus, full-width plus
		' ', '\u00a0', '\u3000', // space, no-break space, ideographic space
		'-', '\u2010', '\u2011', '\u2012', '\u2013', '\u2014', '\u2212', '\uff0d', // hyphens, dashes, minus
		'.', '\uff0e', '(', ')', '\uff08', '\uff09':
		return true
	}
	return unicode.IsDigit(r)
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
