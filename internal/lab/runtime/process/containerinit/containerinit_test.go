package containerinit

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/proc"
)

func TestLookPath(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Join(a, "tool"), 0o644}, {filepath.Join(b, "tool"), 0o755}, {filepath.Join(b, "other"), 0o755}} {
		if err := os.WriteFile(f.path, []byte("#!/bin/sh\n"), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	path := a + ":" + b
	// A non-executable file earlier in PATH is skipped, as execvp does.
	if p, err := LookPath("tool", path); err != nil || p != filepath.Join(b, "tool") {
		t.Errorf("tool: %q %v", p, err)
	}
	if p, err := LookPath(filepath.Join(b, "other"), ""); err != nil || p != filepath.Join(b, "other") {
		t.Errorf("absolute: %q %v", p, err)
	}
	if _, err := LookPath("missing", path); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("missing: %v", err)
	}
	if _, err := LookPath(filepath.Join(a, "tool"), ""); err == nil {
		t.Error("a non-executable path was accepted")
	}
	if _, err := LookPath(a, ""); err == nil {
		t.Error("a directory was accepted")
	}
}

func TestExecNoCommand(t *testing.T) {
	if err := Exec(Options{}, nil); err == nil {
		t.Fatal("no command accepted")
	}
}

// TestMain runs Exec instead of the tests when asked to by
// TestExecPassesNoInheritedFD.
func TestMain(m *testing.M) {
	if os.Getenv("FLATNET_TEST_CONTAINER_INIT") == "1" {
		err := Exec(Options{}, os.Args[1:])
		fmt.Fprintln(os.Stderr, err)
		os.Exit(128)
	}
	os.Exit(m.Run())
}

// The container's command gets 0, 1 and 2 only, not what container-init
// inherited from the agent (or the agent from its starter).
func TestExecPassesNoInheritedFD(t *testing.T) {
	lockPath := filepath.Join(t.TempDir(), "lock")
	fd, err := unix.Open(lockPath, unix.O_RDWR|unix.O_CREAT, 0o600) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := exec.Command(os.Args[0], "sleep", "300")
	cmd.Env = append(os.Environ(), "FLATNET_TEST_CONTAINER_INIT=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	comm := fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, _ := os.ReadFile(comm); strings.TrimSpace(string(b)) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("container-init did not exec sleep within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// comm turns to "sleep" at execve, while the dynamic loader may still
	// hold the shared object it maps (seen in CI: fd 3 on libc.so.6). So
	// look until the set is 0 1 2, failing at once on the inherited file.
	var fds map[int]string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		fds, err = proc.FDs(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Sorted(maps.Keys(fds)); slices.Equal(got, []int{0, 1, 2}) {
			return
		}
		for _, target := range fds {
			if target == lockPath {
				t.Fatalf("the container's command inherited fd %d (%v); want 0 1 2 only", fd, fds)
			}
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Errorf("the container's command has fds %v (%v), want 0 1 2 only; the inherited fd was %d", slices.Sorted(maps.Keys(fds)), fds, fd)
}
