package proc

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A daemon started through a wrapper that execs it is identified by its
// own command line: Running finds it, Stop stops it.
func TestStartViaWrapper(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	wrapper := []string{"sh", "-c", `sleep 0.2; exec "$0" "$@"`}
	pid, err := StartVia("wrapped", wrapper, []string{sleep, "300"}, nil, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, dir, "wrapped")
	if got, ok := Running(dir, "wrapped"); !ok || got != pid {
		t.Fatalf("Running = %d, %v; want %d, true", got, ok, pid)
	}
	if err := Stop(dir, "wrapped", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, ok := Running(dir, "wrapped"); ok {
		t.Error("still running after Stop")
	}
}

// A wrapper that fails before exec makes StartVia fail with its output.
func TestStartViaWrapperFails(t *testing.T) {
	dir := t.TempDir()
	_, err := StartVia("wrapped", []string{"sh", "-c", `echo "cannot enter namespace" >&2; exit 1`}, []string{"/bin/true"}, nil, dir, "")
	if err == nil || !strings.Contains(err.Error(), "cannot enter namespace") {
		t.Fatalf("err = %v, want the wrapper's message", err)
	}
}
