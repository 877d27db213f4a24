package guard_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoPhoneLibrary: a program that imports mutex, funnel or guard does not
// build the phone number library; only guard/phonekey and the example do.
func TestNoPhoneLibrary(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH: cannot list guard's dependencies")
	}
	const module = "github.com/funnelguard/funnelguard/"
	out, err := exec.Command(gobin, "list", "-deps", module+"mutex", module+"funnel", module+"guard").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 || !strings.Contains(string(out), module+"guard\n") {
		t.Fatalf("go list -deps listed no guard:\n%s", out)
	}
	for _, p := range deps {
		if strings.Contains(p, "phonenumbers") || strings.HasPrefix(p, module+"guard/") {
			t.Errorf("mutex, funnel or guard imports %s", p)
		}
	}
}
