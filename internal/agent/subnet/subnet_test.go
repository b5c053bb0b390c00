package subnet

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("%s (-want +got):\n%s", name, d)
	}
}

func TestRenderGolden(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   Config
		types []string
	}{
		{"ipv4.conflist", Config{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, DataDir: "/var/lib/flatnet/lab/x/nodes/n1/cni/networks"}, nil},
		{"dualstack.conflist", Config{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}, MTU: 1450}, nil},
		{"policy.conflist", Config{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, PolicySocket: "/run/flatnet/policy.sock"},
			[]string{"bridge", "bandwidth", "portmap", "flatnet-policy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Render(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, b)
			// libcni reads it as runtimes will.
			cl, err := libcni.ConfListFromBytes(b)
			if err != nil {
				t.Fatal(err)
			}
			var types []string
			for _, p := range cl.Plugins {
				types = append(types, p.Network.Type)
			}
			want := tc.types
			if want == nil {
				want = []string{"bridge", "bandwidth", "portmap"}
			}
			if d := cmp.Diff(want, types); d != "" || cl.Name != "flatnet" {
				t.Errorf("plugins %v name %s", types, cl.Name)
			}
		})
	}
}

func TestRenderRejects(t *testing.T) {
	for _, cidrs := range [][]netip.Prefix{
		nil,
		{{}},
		{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("10.0.1.0/24")},
		{netip.MustParsePrefix("::ffff:10.0.0.0/120")},
	} {
		if _, err := Render(Config{PodCIDRs: cidrs}); err == nil {
			t.Errorf("Render(%v): no error", cidrs)
		}
	}
}

func TestWriteOnlyOnChange(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "net.d")
	path := filepath.Join(dir, FileName)
	changed, err := Write(dir, FileName, []byte("one\n"))
	if err != nil || !changed {
		t.Fatalf("first write: %v %v", changed, err)
	}
	st1, _ := os.Stat(path)
	changed, err = Write(dir, FileName, []byte("one\n"))
	if err != nil || changed {
		t.Fatalf("same content: %v %v", changed, err)
	}
	st2, _ := os.Stat(path)
	if !os.SameFile(st1, st2) || !st1.ModTime().Equal(st2.ModTime()) {
		t.Error("unchanged content rewrote the file")
	}
	changed, err = Write(dir, FileName, []byte("two\n"))
	if err != nil || !changed {
		t.Fatalf("new content: %v %v", changed, err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two\n" {
		t.Errorf("content %q", b)
	}
	st3, _ := os.Stat(path)
	if st3.Mode().Perm() != 0o644 {
		t.Errorf("mode %v", st3.Mode())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("left behind: %v", entries)
	}
}

func TestShadowing(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"05-other.conflist", "00-x.conf", "01-notes.txt", "99-later.conf", FileName} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o644)
	}
	os.Mkdir(filepath.Join(dir, "01-dir.conf"), 0o755)
	got, err := Shadowing(dir, FileName)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"00-x.conf", "05-other.conflist"}, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if got, err := Shadowing(filepath.Join(dir, "missing"), FileName); err != nil || got != nil {
		t.Errorf("missing dir: %v %v", got, err)
	}
}
