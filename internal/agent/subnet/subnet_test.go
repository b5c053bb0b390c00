package subnet

import (
	"encoding/json"
	"flag"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
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
	v4 := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}
	dual := []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}
	for _, tc := range []struct {
		name  string
		cfg   Config
		types []string
	}{
		{"ipv4.conflist", Config{PodCIDRs: v4, DataDir: "/var/lib/flatnet/lab/x/nodes/n1/cni/networks"}, []string{"flatnet"}},
		{"dualstack.conflist", Config{PodCIDRs: dual, MTU: 1450}, []string{"flatnet"}},
		{"policy.conflist", Config{PodCIDRs: v4, PolicySocket: "/run/flatnet/policy.sock"}, []string{"flatnet", "flatnet-policy"}},
		{"classic-ipv4.conflist", Config{Style: StyleClassic, PodCIDRs: v4, DataDir: "/var/lib/flatnet/lab/x/nodes/n1/cni/networks"},
			[]string{"bridge", "bandwidth", "portmap"}},
		{"classic-dualstack.conflist", Config{Style: StyleClassic, PodCIDRs: dual, MTU: 1450}, []string{"bridge", "bandwidth", "portmap"}},
		{"classic-policy.conflist", Config{Style: StyleClassic, PodCIDRs: v4, PolicySocket: "/run/flatnet/policy.sock"},
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
			if d := cmp.Diff(tc.types, types); d != "" || cl.Name != "flatnet" {
				t.Errorf("plugins %v name %s", types, cl.Name)
			}
			hasPolicy := tc.cfg.PolicySocket != ""
			if d := cmp.Diff(Plugins(tc.cfg.Style, hasPolicy), binaries(tc.types)); d != "" {
				t.Errorf("Plugins(%q, %v) (-got +want):\n%s", tc.cfg.Style, hasPolicy, d)
			}
		})
	}
}

// binaries are the plugin binaries a conflist of types runs: bridge
// delegates to host-local.
func binaries(types []string) []string {
	var out []string
	for _, t := range types {
		out = append(out, t)
		if t == "bridge" {
			out = append(out, "host-local")
		}
	}
	return out
}

// The two styles are one network: the same name and version, and the
// flatnet plugin carries the chain's options and capabilities, so a pod
// set up under one is torn down under the other.
func TestStylesAreOneNetwork(t *testing.T) {
	for _, policy := range []string{"", "/run/flatnet/policy.sock"} {
		cfg := Config{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, DataDir: "/d", MTU: 1450, PolicySocket: policy}
		var lists [2]map[string]any
		for i, style := range []string{StyleFlatnet, StyleClassic} {
			cfg.Style = style
			b, err := Render(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &lists[i]); err != nil {
				t.Fatal(err)
			}
		}
		fl, cl := lists[0], lists[1]
		if fl["name"] != cl["name"] || fl["cniVersion"] != cl["cniVersion"] {
			t.Errorf("name/version: flatnet %v %v, classic %v %v", fl["name"], fl["cniVersion"], cl["name"], cl["cniVersion"])
		}
		fp, cp := fl["plugins"].([]any), cl["plugins"].([]any)
		// The chain folded into one plugin: bridge's options, every
		// plugin's capabilities, type flatnet.
		want := map[string]any{}
		caps := map[string]any{}
		for _, p := range cp[:3] {
			for k, v := range p.(map[string]any) {
				if k == "capabilities" {
					maps.Copy(caps, v.(map[string]any))
					continue
				}
				if _, ok := want[k]; !ok {
					want[k] = v
				}
			}
		}
		want["type"], want["capabilities"] = "flatnet", caps
		if d := cmp.Diff(want, fp[0]); d != "" {
			t.Errorf("flatnet plugin (-chain folded +got):\n%s", d)
		}
		// The policy gate, if any, is last in both, unchanged.
		if d := cmp.Diff(cp[3:], fp[1:]); d != "" {
			t.Errorf("plugins after the first (-classic +flatnet):\n%s", d)
		}
	}
}

func TestCheckStyle(t *testing.T) {
	for _, v := range []string{"flatnet", "classic"} {
		if err := CheckStyle(v); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
	for _, v := range []string{"", "Flatnet", "bridge", "chain"} {
		err := CheckStyle(v)
		if err == nil || !strings.Contains(err.Error(), "--cni-conflist") || !strings.Contains(err.Error(), "classic") {
			t.Errorf("CheckStyle(%q): %v", v, err)
		}
	}
	if _, err := Render(Config{Style: "bogus", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}); err == nil {
		t.Error("Render with style bogus: no error")
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
