package testutil_test

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

// The shared server is the binary FUNNELGUARD_REDIS_SERVER names: the version
// it reports in INFO is the one the binary prints with --version. Valkey
// reports redis_version:7.2.4 (the Redis it is compatible with) and its own
// version as valkey_version.
func TestServerIsTheChosenBinary(t *testing.T) {
	b := testutil.RealBackend(t)
	out, err := exec.Command(testutil.ServerName(), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v: %s", testutil.ServerName(), err, out)
	}
	m := regexp.MustCompile(`\bv=(\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("%s --version: no v=<version> in %q", testutil.ServerName(), out)
	}
	info, err := b.Client(t).Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	field := "redis_version"
	if _, ok := fields["valkey_version"]; ok {
		field = "valkey_version"
	}
	t.Logf("%s: %s=%s, redis_version=%s, server_name=%q", testutil.ServerName(), field, fields[field], fields["redis_version"], fields["server_name"])
	if fields[field] != string(m[1]) {
		t.Errorf("INFO server %s=%q, but %s --version says %q", field, fields[field], testutil.ServerName(), m[1])
	}
}

// A server binary that is not there is named, with the variable that chose
// it, in the error of Spawn (and so in the skip or failure of NeedServer).
// (t.Setenv is safe here only while no test of this package starts servers
// in the background, as ScaleOut does.)
func TestMissingServerBinaryNamed(t *testing.T) {
	t.Setenv(testutil.ServerEnv, "funnelguard-no-such-server")
	s, err := testutil.Spawn()
	if err == nil {
		s.Stop()
		t.Fatal("Spawn started a server of a binary that does not exist")
	}
	for _, want := range []string{"funnelguard-no-such-server", testutil.ServerEnv} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Spawn: %v; want it to name %s", err, want)
		}
	}
}
