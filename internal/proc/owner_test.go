package proc

import (
	"path/filepath"
	"testing"
)

// A daemon carries the mark of its state dir, which names no other dir.
func TestStartMarksOwner(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "lab")
	pid, err := Start("sleeper", []string{"sleep", "300"}, []string{OwnerEnv + "=/elsewhere"}, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, dir, "sleeper")
	for _, c := range []struct {
		dir  string
		want bool
	}{{dir, true}, {root, true}, {dir + "x", false}, {filepath.Join(dir, "sub"), false}, {"/elsewhere/x", false}} {
		if got := OwnedBy(pid, c.dir); got != c.want {
			t.Errorf("OwnedBy(daemon of %s, %s) = %v, want %v", dir, c.dir, got, c.want)
		}
	}
}
