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

// TestNoAdapterModules: the library's module requires neither grpc nor
// OpenTelemetry, so a module that imports guard gets neither in its module
// graph: the adapters (grpcguard, otelguard) are modules of their own.
func TestNoAdapterModules(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH: cannot list the module graph")
	}
	out, err := exec.Command(gobin, "list", "-m", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/redis/go-redis/v9 ") {
		t.Fatalf("go list -m all listed no go-redis:\n%s", out)
	}
	for _, m := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(m, "google.golang.org/grpc ") || strings.HasPrefix(m, "go.opentelemetry.io/") ||
			strings.HasPrefix(m, "github.com/funnelguard/funnelguard/grpcguard") || strings.HasPrefix(m, "github.com/funnelguard/funnelguard/otelguard") {
			t.Errorf("the library's module graph holds %s", m)
		}
	}
}
