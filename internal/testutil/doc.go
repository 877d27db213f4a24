// Package testutil gives every funnelguard test a Redis: a real server
// spawned on a free loopback port, and miniredis.
//
// A package's TestMain calls Main, which runs the tests, stops the servers it
// started (by pid) and fails the binary when goroutines leak. Backends runs a
// test on both backends, each with a unique key prefix whose keys are deleted
// when the test ends. Tests that need a real server skip without its binary
// and say so, unless FUNNELGUARD_REQUIRE_REDIS=1, which turns the skip into a
// failure (CI sets it).
//
// The binaries come from the environment: FUNNELGUARD_REDIS_SERVER names the
// server (redis-server by default; it also runs the sentinels, with
// --sentinel) and FUNNELGUARD_REDIS_CLI the client that creates clusters
// (redis-cli by default), each a name looked up on PATH or a path. To run the
// real-server tests on Valkey:
//
//	FUNNELGUARD_REDIS_SERVER=valkey-server FUNNELGUARD_REDIS_CLI=valkey-cli go test ./...
//
// FUNNELGUARD_SERVER_TESTS_ONLY=1 skips the tests on miniredis (Mini, and
// Backends' miniredis half), which no choice of server binary changes: CI's
// second pass, on Valkey, runs only the tests that a server's kind can move.
package testutil
