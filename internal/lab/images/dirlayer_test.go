package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeRoot is a small tree with every kind of entry DirTar meets in a
// Debian root.
func fakeRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"usr/bin", "etc", "tmp", "dev/pts", "proc/1"} {
		must(os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	must(os.WriteFile(filepath.Join(root, "usr/bin/prog"), []byte("#!/bin/sh\n"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr/bin/su"), []byte("su"), 0o755))
	must(os.Chmod(filepath.Join(root, "usr/bin/su"), 0o755|os.ModeSetuid))
	must(os.Link(filepath.Join(root, "usr/bin/prog"), filepath.Join(root, "usr/bin/prog2")))
	must(os.Symlink("usr/bin", filepath.Join(root, "bin")))
	must(os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644))
	must(os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky))
	must(unix.Mkfifo(filepath.Join(root, "etc/fifo"), 0o644))
	must(os.WriteFile(filepath.Join(root, "dev/null"), nil, 0o666))
	must(os.WriteFile(filepath.Join(root, "proc/1/status"), []byte("x"), 0o444))
	return root
}

func tarEntries(t *testing.T, r io.Reader) []string {
	t.Helper()
	var got []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(epoch) || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: mtime %v uname %q gname %q", h.Name, h.ModTime, h.Uname, h.Gname)
		}
		if h.Uid != os.Getuid() || h.Gid != os.Getgid() {
			t.Errorf("%s: owner %d:%d, want the file's %d:%d", h.Name, h.Uid, h.Gid, os.Getuid(), os.Getgid())
		}
		e := fmt.Sprintf("%s %o", h.Name, h.Mode)
		switch h.Typeflag {
		case tar.TypeSymlink:
			e += " -> " + h.Linkname
		case tar.TypeLink:
			e += " link " + h.Linkname
		case tar.TypeReg:
			e += fmt.Sprintf(" %dB", h.Size)
		}
		got = append(got, e)
	}
}

// TestDirTar: walk order, modes with setuid and sticky, a symlink, a hard
// link as a link, no fifo, the runtime's mount points kept empty, and the
// same bytes whatever the files' times.
func TestDirTar(t *testing.T) {
	root := fakeRoot(t)
	var a bytes.Buffer
	if err := DirTar(&a, root, rootSkip); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"bin 777 -> usr/bin",
		"dev/ 755",
		"etc/ 755",
		"etc/passwd 644 26B",
		"proc/ 755",
		"tmp/ 1777",
		"usr/ 755",
		"usr/bin/ 755",
		"usr/bin/prog 755 10B",
		"usr/bin/prog2 755 link usr/bin/prog",
		"usr/bin/su 4755 2B",
	}
	if got := tarEntries(t, bytes.NewReader(a.Bytes())); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(root, "etc/passwd"), later, later); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := DirTar(&b, root, rootSkip); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("a new modification time changed the layer")
	}
}

// TestDirLayerAsBase: a root written by WriteDirLayer is an image's first
// layer, its own files the second; two builds give one digest.
func TestDirLayerAsBase(t *testing.T) {
	root := fakeRoot(t)
	layer := filepath.Join(t.TempDir(), "layer.tar.gz")
	if err := WriteDirLayer(layer, root, rootSkip); err != nil {
		t.Fatal(err)
	}
	s := Spec{
		Ref:   "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1",
		Base:  layer,
		Files: []File{{Path: "/uploads", Dir: true}, {Path: "/var/tmp", Dir: true, Mode: 0o1777}},
		Cmd:   []string{"bash"},
	}
	img, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	base := tarEntries(t, rc)
	rc.Close()
	if len(base) != 11 || base[0] != "bin 777 -> usr/bin" {
		t.Errorf("base layer: %q", base)
	}
	rc, err = layers[1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var own []string
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		own = append(own, fmt.Sprintf("%s %o %c", h.Name, h.Mode, h.Typeflag))
	}
	if got, want := strings.Join(own, "|"), "uploads/ 755 5|var/ 755 5|var/tmp/ 1777 5"; got != want {
		t.Errorf("own layer: %s, want %s", got, want)
	}
	again, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("two builds: %s and %s", d1, d2)
	}
	// Only files: no base, one layer (the pause image's shape).
	if _, err := Build(Spec{Ref: s.Ref, Base: filepath.Join(t.TempDir(), "missing.tar.gz")}); err == nil || !strings.Contains(err.Error(), "base layer") {
		t.Errorf("missing base: %v", err)
	}
}
