package testutil

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestRefusedPortStaysRefused: a Refused address refuses dials, and no
// listener can take its port while the test holds it (CI once saw another
// test's HTTP server answer a port that was only found free).
func TestRefusedPortStaysRefused(t *testing.T) {
	r := NewRefused(t, 0)
	if l, err := net.Listen("tcp", r.Addr); err == nil {
		l.Close()
		t.Fatalf("a listener took %s, the Refused address", r.Addr)
	}
	c, err := net.DialTimeout("tcp", r.Addr, 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("dial of %s connected; want refused", r.Addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial of %s: %v; want connection refused", r.Addr, err)
	}
}
