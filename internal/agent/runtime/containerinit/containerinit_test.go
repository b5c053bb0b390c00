package containerinit

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
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
