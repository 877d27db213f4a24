package main

import (
	"fmt"
	"net"
)

// checkLoopback refuses any address whose host is not a loopback IP or
// "localhost": the benchmark floods the server and deletes keys.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-redis %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-redis %q: only loopback addresses are allowed", addr)
	}
	return nil
}
