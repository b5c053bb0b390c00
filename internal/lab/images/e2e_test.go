package images

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func fakeInputs(t *testing.T) Inputs {
	t.Helper()
	dir := t.TempDir()
	in := Inputs{
		Root:           Root{Dir: filepath.Join(dir, "root"), Layer: filepath.Join(dir, "layer.tar.gz")},
		Agnhost:        filepath.Join(dir, "agnhost"),
		CoreDNS:        filepath.Join(dir, "coredns"),
		FlatnetBin:     filepath.Join(dir, "bin"),
		BusyboxApplets: []string{"[", "sh", "wget", "nc"},
		RootLacks:      []string{"/usr/bin/wget"},
	}
	for _, f := range []string{"root/usr/bin/busybox", "agnhost", "coredns", "bin/flatnet", "bin/flatnet-cni", "bin/flatnet-pause"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("usr/bin", filepath.Join(in.Root.Dir, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := WriteDirLayer(in.Root.Layer, in.Root.Dir, nil); err != nil {
		t.Fatal(err)
	}
	return in
}

// TestE2ESpecsMatchUpstream: every e2e image carries the name and tag of
// the e2e suite's image manifest (read from the module cache when it is
// there), and the entrypoints upstream's Dockerfiles set.
func TestE2ESpecsMatchUpstream(t *testing.T) {
	specs := E2ESpecs(fakeInputs(t))
	byRef := map[string]Spec{}
	for _, s := range specs {
		byRef[s.Ref] = s
		if _, err := Build(s); err != nil {
			t.Errorf("%s: %v", s.Ref, err)
		}
	}
	for ref, want := range map[string]string{
		PauseRef:   "[/pause] []",
		AgnhostRef: "[/agnhost] [pause]",
		// The CNP suite's `*-client` containers have no command: agnhost's
		// default (pause) keeps them running.
		AgnhostCNPRef: "[/agnhost] [pause]",
		GlibcDNSRef:   "[] [bash]",
		BusyboxRef:    "[] [sh]",
		NginxRef:      "[] [nginx -g daemon off;]",
		FlatnetRef:    "[/usr/local/bin/flatnet] []",
		CoreDNSRef:    "[/coredns] []",
	} {
		s, ok := byRef[ref]
		if !ok {
			t.Errorf("no image %s", ref)
			continue
		}
		if got := fmt.Sprint(s.Entrypoint, " ", s.Cmd); got != want {
			t.Errorf("%s: entrypoint and cmd %s, want %s", ref, got, want)
		}
	}
	if len(specs) != 8 {
		t.Errorf("%d images, want 8 (no echo-basic without its binary)", len(specs))
	}
	var agnhost []string
	for _, f := range byRef[AgnhostRef].Files {
		agnhost = append(agnhost, fmt.Sprintf("%s %o %s", f.Path, f.Mode, f.Link))
	}
	if want := []string{
		"/agnhost 755 ", "/agnhost-2 777 agnhost", "/coredns 755 ", "/localhost.crt 0 ", "/localhost.key 600 ",
		"/uploads 0 ", "/usr/bin/wget 777 /bin/busybox",
	}; !slices.Equal(agnhost, want) {
		t.Errorf("agnhost's files:\n%q\nwant\n%q", agnhost, want)
	}

	manifest := moduleFile(t, "k8s.io/kubernetes@v1.37.2", "test/utils/image/manifest.go")
	if manifest == "" {
		return
	}
	for id, ref := range map[string]string{"Agnhost": AgnhostRef, "GlibcDnsTesting": GlibcDNSRef, "BusyBox": BusyboxRef, "Nginx": NginxRef} {
		m := regexp.MustCompile(`configs\[` + id + `\] = Config\{list\.PromoterE2eRegistry, "([^"]+)", "([^"]+)"\}`).FindStringSubmatch(manifest)
		if m == nil {
			t.Errorf("manifest.go has no PromoterE2eRegistry line for %s", id)
			continue
		}
		if want := "registry.k8s.io/e2e-test-images/" + m[1] + ":" + m[2]; ref != want {
			t.Errorf("%s: %s, manifest.go says %s", id, ref, want)
		}
	}
	if m := regexp.MustCompile(`configs\[Pause\] = Config\{list\.GcRegistry, "pause", "([^"]+)"\}`).FindStringSubmatch(manifest); m == nil || PauseRef != "registry.k8s.io/pause:"+m[1] {
		t.Errorf("pause: %s, manifest.go says %v", PauseRef, m)
	}
}

// moduleFile reads a file of a module in the module cache, or returns ""
// (logged) when the module was never downloaded.
func moduleFile(t *testing.T, module, file string) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Logf("go env GOMODCACHE: %v; not checking against %s", err, module)
		return ""
	}
	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), module, file))
	if err != nil {
		t.Logf("%v: not checking against %s (hack/build-k8s.sh downloads it)", err, module)
		return ""
	}
	return string(b)
}

// TestBuildCached: the second build of the same inputs is a hit that does
// not rewrite the tarball; a changed input file or config is a miss.
func TestBuildCached(t *testing.T) {
	in := fakeInputs(t)
	dir := t.TempDir()
	spec := E2ESpecs(in)[1] // agnhost, on the base layer
	build := func() Tarball {
		t.Helper()
		tb, err := buildCached(dir, spec, hasher{})
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	first := build()
	if first.Cached || first.Size == 0 || filepath.Base(first.Path) != "agnhost-2.66.1.tar" {
		t.Fatalf("first build: %+v", first)
	}
	st1, _ := os.Stat(first.Path)
	second := build()
	st2, _ := os.Stat(second.Path)
	if !second.Cached || second.Size != first.Size || !st1.ModTime().Equal(st2.ModTime()) {
		t.Errorf("second build: %+v (mtime %v, was %v)", second, st2.ModTime(), st1.ModTime())
	}
	if err := os.WriteFile(in.Agnhost, []byte("a new agnhost"), 0o755); err != nil {
		t.Fatal(err)
	}
	if third := build(); third.Cached {
		t.Error("a changed agnhost binary was a cache hit")
	}
	spec.Cmd = []string{"netexec"}
	if fourth := build(); fourth.Cached {
		t.Error("a changed command was a cache hit")
	}
	os.Remove(first.Path)
	if fifth := build(); fifth.Cached {
		t.Error("a missing tarball was a cache hit")
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	slices.Sort(left)
	if want := []string{first.Path, first.Path + ".key"}; !slices.Equal(left, want) {
		t.Errorf("cache holds %q, want %q", left, want)
	}
}

func TestTarballName(t *testing.T) {
	for ref, want := range map[string]string{
		AgnhostRef: "agnhost-2.66.1.tar",
		PauseRef:   "pause-3.10.2.tar",
		FlatnetRef: "flatnet-dev.tar",
	} {
		if got := tarballName(ref); got != want {
			t.Errorf("%s: %s, want %s", ref, got, want)
		}
	}
}

func TestE2EMissingInputs(t *testing.T) {
	in := fakeInputs(t)
	_, err := E2E(t.Context(), Config{CacheDir: t.TempDir(), Agnhost: filepath.Join(t.TempDir(), "agnhost"), FlatnetBin: in.FlatnetBin})
	if err == nil || !strings.Contains(err.Error(), "hack/build-k8s.sh agnhost") {
		t.Errorf("missing agnhost: %v", err)
	}
	_, err = E2E(t.Context(), Config{CacheDir: t.TempDir(), Agnhost: in.Agnhost, CoreDNS: filepath.Join(t.TempDir(), "coredns"), FlatnetBin: in.FlatnetBin})
	if err == nil || !strings.Contains(err.Error(), "hack/build-coredns.sh") {
		t.Errorf("missing coredns: %v", err)
	}
	_, err = E2E(t.Context(), Config{CacheDir: t.TempDir(), Agnhost: in.Agnhost, CoreDNS: in.CoreDNS, FlatnetBin: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "make build") {
		t.Errorf("missing flatnet: %v", err)
	}
}

// TestRootLacks: an applet is linked only when no PATH directory of the
// root has its name (Debian's nc, ip and sh stay), at its own path with
// the root's merged /usr applied; linuxrc (no directory) is left out.
func TestRootLacks(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"usr/bin/nc", "usr/sbin/ip", "usr/bin/sh", "usr/local/bin/ping6"} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"bin": "usr/bin", "sbin": "/usr/sbin"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	got := rootLacks(root, []string{
		"usr/bin/wget", "bin/nc", "sbin/ip", "bin/sh", "bin/ping", "bin/ping6", "sbin/ifconfig", "usr/sbin/arping", "linuxrc",
	})
	want := []string{"/usr/bin/wget", "/usr/bin/ping", "/usr/sbin/ifconfig", "/usr/sbin/arping"}
	if !slices.Equal(got, want) {
		t.Errorf("rootLacks: %q, want %q", got, want)
	}
}

func TestDefaultCacheDir(t *testing.T) {
	t.Setenv("FLATNET_CACHE", "/var/cache/fn")
	if d, err := DefaultCacheDir(); err != nil || d != "/var/cache/fn/images" {
		t.Errorf("DefaultCacheDir: %q, %v", d, err)
	}
}

// TestAgnhostCNP: agnhost:2.45 (the CNP conformance suite's tag) is the
// lab's agnhost, with AgnhostCNP's binary as /agnhost when given, and
// nothing else changed.
func TestAgnhostCNP(t *testing.T) {
	in := fakeInputs(t)
	agnhostBin := func(specs []Spec, ref string) (Spec, string) {
		for _, s := range specs {
			if s.Ref != ref {
				continue
			}
			for _, f := range s.Files {
				if f.Path == "/agnhost" {
					return s, f.Source
				}
			}
		}
		t.Fatalf("no /agnhost in %s", ref)
		return Spec{}, ""
	}
	specs := E2ESpecs(in)
	up, upBin := agnhostBin(specs, AgnhostRef)
	cnp, cnpBin := agnhostBin(specs, AgnhostCNPRef)
	if cnpBin != in.Agnhost || upBin != in.Agnhost {
		t.Errorf("without AgnhostCNP: /agnhost from %s and %s, want %s for both", upBin, cnpBin, in.Agnhost)
	}
	cnp.Ref = up.Ref
	if got, want := fmt.Sprintf("%+v", cnp), fmt.Sprintf("%+v", up); got != want {
		t.Errorf("agnhost:2.45 differs from agnhost:2.66.1 beyond its name:\n%s\n%s", got, want)
	}

	in.AgnhostCNP = filepath.Join(t.TempDir(), "agnhost-cnp")
	specs = E2ESpecs(in)
	if _, b := agnhostBin(specs, AgnhostCNPRef); b != in.AgnhostCNP {
		t.Errorf("with AgnhostCNP: /agnhost from %s, want %s", b, in.AgnhostCNP)
	}
	if _, b := agnhostBin(specs, AgnhostRef); b != in.Agnhost {
		t.Errorf("with AgnhostCNP: agnhost:2.66.1's /agnhost from %s, want %s", b, in.Agnhost)
	}
}

// TestEchoBasic: with its binary, echo-basic under both tags the Gateway
// API conformance suite v1.6.3 names (base/manifests.yaml, read from the
// module cache when it is there), upstream's entrypoint, no command.
func TestEchoBasic(t *testing.T) {
	in := fakeInputs(t)
	in.EchoBasic = filepath.Join(t.TempDir(), "echo-basic")
	if err := os.WriteFile(in.EchoBasic, []byte("echo"), 0o755); err != nil {
		t.Fatal(err)
	}
	refs := map[string]bool{}
	for _, s := range E2ESpecs(in) {
		refs[s.Ref] = true
		if s.Ref != EchoBasicRef && s.Ref != EchoBasicDevRef {
			continue
		}
		if got := fmt.Sprint(s.Entrypoint, s.Cmd, " ", len(s.Files), " ", s.Files[0].Path, " ", s.Files[0].Source); got != "[/echo-basic] [] 1 /echo-basic "+in.EchoBasic {
			t.Errorf("%s: %s", s.Ref, got)
		}
		if _, err := Build(s); err != nil {
			t.Errorf("%s: %v", s.Ref, err)
		}
	}
	if !refs[EchoBasicRef] || !refs[EchoBasicDevRef] || !refs[CoreDNSRef] {
		t.Errorf("images %v: want %s, %s and %s", refs, EchoBasicRef, EchoBasicDevRef, CoreDNSRef)
	}
	manifests := moduleFile(t, "sigs.k8s.io/gateway-api/conformance@v1.6.3", "base/manifests.yaml")
	if manifests == "" {
		return
	}
	for _, m := range regexp.MustCompile(`image: (\S+)`).FindAllStringSubmatch(manifests, -1) {
		if !refs[m[1]] {
			t.Errorf("base/manifests.yaml runs %s: the lab has no such image", m[1])
		}
	}
}
