// Package testutil gives every funnelguard test a Redis: a real redis-server
// spawned on a free loopback port, and miniredis.
//
// A package's TestMain calls Main, which runs the tests, stops the servers it
// started (by pid) and fails the binary when goroutines leak. Backends runs a
// test on both backends, each with a unique key prefix whose keys are deleted
// when the test ends. Tests that need a real server skip without redis-server
// on PATH and say so, unless FUNNELGUARD_REQUIRE_REDIS=1, which turns the skip
// into a failure (CI sets it).
package testutil
