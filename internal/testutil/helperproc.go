package testutil

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// HelperCommand returns a command that runs the test binary again as a
// helper process: only the test named run, with env added to the
// environment and timeout as its -test.timeout. The helper dies with the
// test process (Pdeathsig), and when t ends it is continued (a test may
// have stopped it) and killed, by its pid, if it was started. The caller
// sets its pipes and starts it.
func HelperCommand(t testing.TB, run string, timeout time.Duration, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^"+run+"$", "-test.timeout="+timeout.String())
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t.Cleanup(func() {
		if cmd.Process != nil { // harmless once it has exited
			_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
			_ = cmd.Process.Kill()
		}
	})
	return cmd
}
