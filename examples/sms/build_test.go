package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// built is the service's binary, built once for the whole test run: each
// link of it costs about 1.5 s of CPU, and 16 places in the tests run it.
var built struct {
	once sync.Once
	dir  string // holds the binary, "sms"; removed by TestMain when the run ends
	err  error
}

// serviceBinary returns the path of the service built from this directory,
// building it on the first call; t fails if the build does.
func serviceBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "sms-binary-")
		if built.err != nil {
			return
		}
		if out, err := exec.Command(goTool(), "build", "-o", filepath.Join(built.dir, "sms"), ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return filepath.Join(built.dir, "sms")
}

// removeBinary removes what serviceBinary built, if anything.
func removeBinary() {
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
}

// goTool returns the go command that builds the binary.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}
