package guard_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// TestFreshImporter: a new module that imports only mutex, or only guard,
// and runs go mod tidy gets at most mostModules modules in go list -m all
// (its own and the library's among them), and none of the workshop's: the
// example service, the phone library, the adapters, the reliability suite
// and the bench are modules of their own.
func TestFreshImporter(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH: cannot build an importer's module graph")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// go-redis alone gives 11 (with the importer's own line); the library
	// itself, x/time and miniredis (with gopher-lua: the runnable Examples
	// and the tests' embedded server) the other 4.
	const mostModules = 15
	for _, pkg := range []string{"mutex", "guard"} {
		t.Run(pkg, func(t *testing.T) {
			dir := t.TempDir()
			write := func(name, text string) {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write("go.mod", "module importer\n\ngo 1.26.0\n\nrequire github.com/funnelguard/funnelguard v0.0.0\n\n"+
				"replace github.com/funnelguard/funnelguard => "+root+"\n")
			write("main.go", "package main\n\nimport _ \"github.com/funnelguard/funnelguard/"+pkg+"\"\n\nfunc main() {}\n")
			run := func(args ...string) string {
				cmd := exec.Command(gobin, args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
				}
				return string(out)
			}
			run("mod", "tidy")
			mods := strings.Fields(run("list", "-m", "-f", "{{.Path}}", "all"))
			if !slices.Contains(mods, "github.com/redis/go-redis/v9") {
				t.Fatalf("go list -m all listed no go-redis: %q", mods)
			}
			for _, m := range mods {
				for _, bad := range []string{"google.golang.org/grpc", "go.opentelemetry.io/", "github.com/nyaruka/phonenumbers",
					"github.com/chromedp/", "github.com/prometheus/", "github.com/Shopify/toxiproxy", "github.com/anishathalye/porcupine",
					"go.uber.org/goleak", "github.com/rs/zerolog", "github.com/funnelguard/funnelguard/"} {
					if strings.HasPrefix(m, bad) {
						t.Errorf("an importer of %s gets %s", pkg, m)
					}
				}
			}
			if len(mods) > mostModules {
				t.Errorf("an importer of %s gets %d modules, want at most %d: %q", pkg, len(mods), mostModules, mods)
			}
			t.Logf("an importer of %s gets %d modules", pkg, len(mods))
		})
	}
}
