package images

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestDebianKey(t *testing.T) {
	d := Debian{Suite: "bookworm", Packages: []string{"curl", "bind9-dnsutils"}}
	k := d.Key()
	if len(k) != 16 {
		t.Fatalf("key %q", k)
	}
	if swapped := (Debian{Suite: "bookworm", Packages: []string{"bind9-dnsutils", "curl"}}); swapped.Key() != k {
		t.Error("package order changed the key")
	}
	for _, other := range []Debian{
		{Suite: "trixie", Packages: d.Packages},
		{Suite: "bookworm", Packages: []string{"curl"}},
		{Suite: "bookworm", Packages: d.Packages, Passwd: []string{"u:x:1000:1000::/:/bin/sh"}},
	} {
		if other.Key() == k {
			t.Errorf("%+v: same key as %+v", other, d)
		}
	}
	if !slices.Equal(d.Packages, []string{"curl", "bind9-dnsutils"}) {
		t.Error("Key sorted the caller's slice")
	}
}

// TestDebootstrapArgv: both stages run in namespaces of their own, the
// first only downloads and unpacks (--foreign) so the policy-rc.d can go in
// before any package script runs.
func TestDebootstrapArgv(t *testing.T) {
	d := Debian{Suite: "bookworm", Packages: []string{"nginx-light", "curl"}}
	got := strings.Join(d.debootstrapArgv("/c/t/root", "http://m/debian"), " ")
	want := "unshare --mount --pid --fork --kill-child --propagation private -- debootstrap --foreign --variant=minbase --include=curl,nginx-light bookworm /c/t/root http://m/debian"
	if got != want {
		t.Errorf("first stage:\n got %s\nwant %s", got, want)
	}
	got = strings.Join(secondStageArgv("/c/t/root"), " ")
	want = "unshare --mount --pid --fork --kill-child --propagation private -- chroot /c/t/root /debootstrap/debootstrap --second-stage"
	if got != want {
		t.Errorf("second stage:\n got %s\nwant %s", got, want)
	}
}

// TestTrim: documentation goes but copyright files, apt's lists and
// translations go, the host's resolv.conf (here a symlink out of the root)
// is replaced without following it, users are appended.
func TestTrim(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "host-resolv.conf")
	write := func(p, s string) {
		t.Helper()
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{
		"usr/share/doc/curl/copyright", "usr/share/doc/curl/changelog.gz", "usr/share/man/man1/curl.1.gz",
		"var/lib/apt/lists/deb.debian.org_Release", "var/cache/apt/archives/curl.deb", "var/log/dpkg.log",
		"usr/share/locale/de/LC_MESSAGES/x.mo", "usr/share/locale/locale.alias", "usr/sbin/policy-rc.d",
		"debootstrap/debootstrap.log", "usr/bin/curl",
	} {
		write(f, "x")
	}
	write("etc/passwd", "root:x:0:0::/root:/bin/sh\n")
	write("etc/group", "root:x:0:\n")
	write("etc/hostname", "buildhost\n")
	if err := os.WriteFile(outside, []byte("nameserver 192.0.2.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	d := Debian{Passwd: []string{"u:x:1000:1000::/home/u:/bin/sh"}, Group: []string{"u:x:1000:", "g:x:50000:u"}}
	if err := d.trim(root); err != nil {
		t.Fatal(err)
	}
	var left []string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(root, p)
			left = append(left, rel)
		}
		return nil
	})
	want := []string{"etc/group", "etc/hostname", "etc/hosts", "etc/passwd", "etc/resolv.conf",
		"usr/bin/curl", "usr/share/doc/curl/copyright", "usr/share/locale/locale.alias"}
	if !slices.Equal(left, want) {
		t.Errorf("left:\n%q\nwant\n%q", left, want)
	}
	read := func(p string) string {
		b, _ := os.ReadFile(p)
		return string(b)
	}
	if got := read(outside); got != "nameserver 192.0.2.1\n" {
		t.Errorf("the file outside the root was written: %q", got)
	}
	if got := read(filepath.Join(root, "etc/resolv.conf")); got != "" {
		t.Errorf("resolv.conf: %q", got)
	}
	if got := read(filepath.Join(root, "etc/hostname")); got != "localhost\n" {
		t.Errorf("hostname: %q", got)
	}
	if got := read(filepath.Join(root, "etc/group")); got != "root:x:0:\nu:x:1000:\ng:x:50000:u\n" {
		t.Errorf("group: %q", got)
	}
	if got := read(filepath.Join(root, "etc/passwd")); !strings.HasSuffix(got, "\nu:x:1000:1000::/home/u:/bin/sh\n") {
		t.Errorf("passwd: %q", got)
	}
}

// TestEnsureFindsTheCache: a root whose done stamp is there is used
// as is, with no root privileges, debootstrap or network.
func TestEnsureFindsTheCache(t *testing.T) {
	cache := t.TempDir()
	d := Debian{Suite: "bookworm", Packages: []string{"curl"}}
	dir := filepath.Join(cache, "debian-bookworm-"+d.Key())
	if err := os.MkdirAll(filepath.Join(dir, "root"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := d.Ensure(t.Context(), cache, "http://127.0.0.1:1/unused", nil)
	if err != nil || r.Built || r.Dir != filepath.Join(dir, "root") || r.Layer != filepath.Join(dir, "layer.tar.gz") {
		t.Fatalf("Ensure: %+v, %v", r, err)
	}
}

func TestCheckMirror(t *testing.T) {
	err := checkMirror(t.Context(), "http://127.0.0.1:1/debian", "bookworm")
	if err == nil || !strings.Contains(err.Error(), "--mirror") {
		t.Errorf("unreachable mirror: %v", err)
	}
}
