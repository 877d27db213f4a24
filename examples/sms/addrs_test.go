package main

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
)

// Two listen flags that name one address are refused before anything
// listens, with an error naming both flags; two that do not, or pick their
// ports with :0, are not.
func TestListenAddrsDistinct(t *testing.T) {
	for _, c := range []struct {
		addr, metrics, admin string
		both                 string // the two flags named; "" for no error
	}{
		{"127.0.0.1:8080", "", "127.0.0.1:8080", "-addr -admin-addr"},
		{"127.0.0.1:8080", "127.0.0.1:8080", "", "-addr -metrics-addr"},
		{"127.0.0.1:8080", "127.0.0.1:9090", "127.0.0.1:9090", "-metrics-addr -admin-addr"},
		{":8080", "127.0.0.1:8080", "", "-addr -metrics-addr"},
		{"127.0.0.1:8080", "", "0.0.0.0:8080", "-addr -admin-addr"},
		{"[::1]:8080", "", "[::]:8080", "-addr -admin-addr"},
		{"localhost:8080", "", "127.0.0.1:8080", "-addr -admin-addr"},
		{"127.0.0.1:8080", "", "127.0.0.1:http-alt", "-addr -admin-addr"},
		{"127.0.0.1:8080", "127.0.0.1:9100", "127.0.0.1:9090", ""},
		{"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", ""},
		{"127.0.0.1:8080", "", "127.0.0.2:8080", ""},
		{"0.0.0.0:8080", "", "[::1]:8080", ""},
		{"127.0.0.1:8080", "", "", ""},
	} {
		err := checkAddrs(listenFlag{"-addr", c.addr}, listenFlag{"-metrics-addr", c.metrics}, listenFlag{"-admin-addr", c.admin})
		if c.both == "" {
			if err != nil {
				t.Errorf("%+v: %v; want none", c, err)
			}
			continue
		}
		a, b, _ := strings.Cut(c.both, " ")
		if !errors.Is(err, errConfig) || !strings.Contains(err.Error(), a+" ") || !strings.Contains(err.Error(), b+" ") {
			t.Errorf("%+v: %v; want errConfig naming %s and %s", c, err, a, b)
		}
	}
}

// The binary's run refuses -admin-addr equal to -addr, and -metrics-addr
// equal to -addr, naming the flags, not "address already in use".
func TestRunRefusesOneAddressTwice(t *testing.T) {
	t.Setenv("SMS_ADMIN_TOKEN", "admin-token-of-the-test-12345678")
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port nothing else takes while this runs
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, c := range []struct {
		flag string
		want string
	}{{"-admin-addr", "-addr"}, {"-metrics-addr", "-addr"}} {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // should it serve, it stops at once
		err := run(ctx, []string{"-addr", addr, c.flag, addr}, io.Discard, io.Discard)
		if !errors.Is(err, errConfig) || !strings.Contains(err.Error(), c.flag+" ") || !strings.Contains(err.Error(), c.want+" ") ||
			strings.Contains(err.Error(), "in use") {
			t.Errorf("%s %s %s %s: %v; want errConfig naming both flags", "-addr", addr, c.flag, addr, err)
		}
	}
}
