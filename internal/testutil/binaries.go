package testutil

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// ServerEnv names the variable that chooses the server binary of the
// real-server tests, by name (looked up on PATH) or by path: redis-server
// when unset or empty, valkey-server to run the suite on Valkey. The same
// binary runs the sentinels (with --sentinel).
const ServerEnv = "FUNNELGUARD_REDIS_SERVER"

// CLIEnv names the variable that chooses the command-line client that joins
// a test cluster (--cluster create): redis-cli when unset or empty,
// valkey-cli with valkey-server.
const CLIEnv = "FUNNELGUARD_REDIS_CLI"

// A binary is a program the real-server tests run, chosen by a variable.
type binary struct {
	env, def string
	need     string // what a test needs it for, for the skip message
	pkg      string // the Debian package of def
}

var (
	serverBin = binary{env: ServerEnv, def: "redis-server", need: "a real server (Redis or Valkey)", pkg: "redis-server"}
	cliBin    = binary{env: CLIEnv, def: "redis-cli", need: "the client that creates a test cluster", pkg: "redis-tools"}
)

// ServerName returns the server binary the tests start, as ServerEnv names
// it (redis-server by default), for messages and figures.
func ServerName() string { return serverBin.name() }

// name returns the binary as its variable names it, or the default.
func (b binary) name() string {
	if v := os.Getenv(b.env); v != "" {
		return v
	}
	return b.def
}

// path returns the binary's path, or "" if there is none.
func (b binary) path() string {
	p, err := exec.LookPath(b.name())
	if err != nil {
		return ""
	}
	return p
}

// missing says that the binary was not found, where its name came from and
// what to do about it: the skip (or failure) message of NeedServer and
// NeedCluster.
func (b binary) missing() string {
	if os.Getenv(b.env) != "" {
		return fmt.Sprintf("%s (from %s) is not found: this test needs it as %s; install it or change %s",
			b.name(), b.env, b.need, b.env)
	}
	return fmt.Sprintf("%s (the default of %s) is not on PATH: this test needs it as %s (apt-get install %s, or set %s to another binary)",
		b.def, b.env, b.need, b.pkg, b.env)
}

// err is missing as an error, for what starts servers outside a test.
func (b binary) err() error { return errors.New(b.missing()) }

// serverPath returns the server binary (ServerEnv), or "" if there is none.
func serverPath() string { return serverBin.path() }

// cliPath returns the CLI binary (CLIEnv), or "" if there is none.
func cliPath() string { return cliBin.path() }
