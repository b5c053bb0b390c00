package images

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func testSpec(t *testing.T) Spec {
	bin := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return Spec{
		Ref: "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
		Files: []File{
			{Path: "/agnhost", Mode: 0o755, Source: bin},
			{Path: "/agnhost-2", Link: "agnhost"},
			{Path: "/etc/resolv.conf", Data: []byte("")},
			{Path: "/usr/local/bin/tool", Mode: 0o755, Data: []byte("x")},
		},
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
	}
}

// TestBuildIsReproducible: the same files give the same digest (callers
// cache by it), and other files another.
func TestBuildIsReproducible(t *testing.T) {
	s := testSpec(t)
	a, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Fatalf("two builds of one spec: %s and %s", da, db)
	}
	s.Files[2].Data = []byte("nameserver 10.96.0.10\n")
	c, _ := Build(s)
	if dc, _ := c.Digest(); dc == da {
		t.Fatal("another file content, same digest")
	}
}

// TestWriteReadsBack: the tarball holds the image under its name, with its
// config and one layer whose entries are in path order with explicit
// parents, root-owned, at the fixed time.
func TestWriteReadsBack(t *testing.T) {
	s := testSpec(t)
	img, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	pause, err := Build(Spec{Ref: "registry.k8s.io/pause:3.10.2", Files: []File{{Path: "/pause", Mode: 0o755, Data: []byte("p")}}, Entrypoint: []string{"/pause"}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "images.tar")
	if err := Write(file, map[string]v1.Image{s.Ref: img, "registry.k8s.io/pause:3.10.2": pause}); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(s.Ref)
	back, err := tarball.ImageFromPath(file, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || fmt.Sprint(cf.Config.Entrypoint) != "[/agnhost]" || fmt.Sprint(cf.Config.Cmd) != "[pause]" || len(cf.Config.Env) != 1 {
		t.Fatalf("config: os %s entrypoint %v cmd %v env %v", cf.OS, cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Env)
	}
	layers, err := back.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var got []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.ModTime.Unix() != 0 {
			t.Errorf("%s: uid %d gid %d mtime %v", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		e := fmt.Sprintf("%s %o", h.Name, h.Mode)
		if h.Typeflag == tar.TypeSymlink {
			e += " -> " + h.Linkname
		}
		got = append(got, e)
	}
	want := "agnhost 755|agnhost-2 644 -> agnhost|etc/ 755|etc/resolv.conf 644|usr/ 755|usr/local/ 755|usr/local/bin/ 755|usr/local/bin/tool 755"
	if g := strings.Join(got, "|"); g != want {
		t.Errorf("layer entries:\n got %s\nwant %s", g, want)
	}
	ptag, _ := name.NewTag("registry.k8s.io/pause:3.10.2")
	if _, err := tarball.ImageFromPath(file, &ptag); err != nil {
		t.Errorf("the second image is not in the tarball: %v", err)
	}
	if _, err := os.Stat(file + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left: %v", err)
	}
}

func TestBadSpecs(t *testing.T) {
	for _, c := range []struct {
		spec Spec
		want string
	}{
		{Spec{Ref: "UPPER/case:1"}, "image \"UPPER/case:1\""},
		{Spec{Ref: "x.io/a:1", Files: []File{{Path: "rel"}}}, "want an absolute path"},
		{Spec{Ref: "x.io/a:1", Files: []File{{Path: "/a"}, {Path: "/a/"}}}, "given twice"},
		{Spec{Ref: "x.io/a:1", Files: []File{{Path: "/a"}, {Path: "/a/b"}}}, "both a file and a directory"},
		{Spec{Ref: "x.io/a:1", Files: []File{{Path: "/a", Source: "/nonexistent/file"}}}, "/nonexistent/file"},
	} {
		if _, err := Build(c.spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want it to contain %q", c.spec, err, c.want)
		}
	}
	if err := Write(filepath.Join(t.TempDir(), "x.tar"), nil); err == nil {
		t.Error("writing no image: no error")
	}
}

func TestPauseImage(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "flatnet-pause")
	if out, err := exec.Command("go", "build", "-o", bin, "../../../cmd/flatnet-pause").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	img, err := Build(Pause(bin))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil || fmt.Sprint(cf.Config.Entrypoint) != "[/pause]" {
		t.Fatalf("pause config: %v %v", cf, err)
	}
}
