package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// clientIP keys on the peer, or with -trust-proxy on the address the proxy
// saw: the rightmost X-Forwarded-For entry, never one the client wrote.
func TestClientIP(t *testing.T) {
	for _, tc := range []struct {
		name   string
		trust  bool
		remote string
		xff    []string
		want   string
	}{
		{"peer", false, "203.0.113.7:1", nil, "203.0.113.7"},
		{"header ignored without -trust-proxy", false, "203.0.113.7:1", []string{"198.51.100.1"}, "203.0.113.7"},
		{"proxy", true, "10.0.0.1:1", []string{"203.0.113.7"}, "203.0.113.7"},
		{"spoofed entries", true, "10.0.0.1:1", []string{"198.51.100.1, 198.51.100.2, 203.0.113.7"}, "203.0.113.7"},
		{"spoofed line", true, "10.0.0.1:1", []string{"198.51.100.1", "203.0.113.7"}, "203.0.113.7"},
		{"proxy sent no header", true, "10.0.0.1:1", nil, "10.0.0.1"},
		{"malformed entry", true, "10.0.0.1:1", []string{"198.51.100.1, garbage"}, "10.0.0.1"},
		{"IPv6 by /64", true, "10.0.0.1:1", []string{"2001:db8:1:2:3:4:5:6"}, "2001:db8:1:2::/64"},
		{"IPv6 peer", false, "[2001:db8:1:2:3:4:5:6]:1", nil, "2001:db8:1:2::/64"},
		{"IPv4-mapped", false, "[::ffff:203.0.113.7]:1", nil, "203.0.113.7"},
		{"no address", false, "@", nil, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/api/sms/send", nil)
			r.RemoteAddr = tc.remote
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := clientIP(r, tc.trust); got != tc.want {
				t.Fatalf("clientIP = %q; want %q", got, tc.want)
			}
		})
	}
}
