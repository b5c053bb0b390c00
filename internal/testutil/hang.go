package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// HangingTool makes name, found first on PATH for the rest of t, a tool
// that never finishes and whose child holds its stdout: what a tool stuck
// on a lock (iptables-restore -w on a held xtables lock) looks like to
// its caller. PATH holds only its directory afterwards.
func HangingTool(t testing.TB, name string) {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fake := "#!/bin/sh\n" + sleep + " 60 &\nexec " + sleep + " 60\n"
	if err := os.WriteFile(filepath.Join(dir, name), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
}
