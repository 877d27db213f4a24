package testutil_test

import (
	"testing"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

// With FUNNELGUARD_SERVER_TESTS_ONLY=1 a test on miniredis skips (CI's
// Valkey pass); without it, it gets its miniredis.
func TestMiniSkipsInServerOnlyRuns(t *testing.T) {
	for _, c := range []struct {
		env  string
		skip bool
	}{{"1", true}, {"", false}, {"0", false}} {
		t.Run("env="+c.env, func(t *testing.T) {
			t.Setenv(testutil.ServerTestsOnlyEnv, c.env)
			var got *testutil.Backend
			inner := t.Run("mini", func(t *testing.T) { got = testutil.Mini(t) })
			if !inner {
				t.Fatal("the subtest failed")
			}
			if skipped := got == nil; skipped != c.skip {
				t.Fatalf("%s=%q: skipped %v; want %v", testutil.ServerTestsOnlyEnv, c.env, skipped, c.skip)
			}
		})
	}
}
