package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFileReplacesAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "new" {
		t.Fatalf("content %q, %v; want new", b, err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries, want only state.json", len(ents))
	}
}

func TestWriteFailureKeepsOldContent(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, failingReader{}, 0o644); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("err = %v, want an error naming %s", err, p)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("content %q after a failed write, want old", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("a failed write left %d entries, want 1", len(ents))
	}
}

func TestWriteFileMissingDirectory(t *testing.T) {
	p := filepath.Join(t.TempDir(), "no", "such", "file")
	if err := WriteFile(p, []byte("x"), 0o644); err == nil {
		t.Fatal("writing into a missing directory succeeded")
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, os.ErrClosed }
