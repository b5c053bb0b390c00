package images

// The Debian root under most lab images, made once with debootstrap and
// kept in the cache (its directory, for files other images take from it,
// and its layer file, for Spec.Base).
//
// Safety: debootstrap runs as root and mounts proc, sys and sometimes binds
// of the host's /dev inside its target. Both of its stages run under
// `unshare --mount --pid --fork --kill-child --propagation private`: every
// mount it makes lives in a namespace that dies with it, on success,
// failure or cancel, and so does every process a package's script starts
// (a policy-rc.d refusing all service starts is installed between the
// stages as well). Before a target is removed, /proc/self/mountinfo is
// checked for anything still mounted below it: a RemoveAll never walks
// into the host's /dev or /sys.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/flatnet/flatnet/internal/mountinfo"
)

// Debian is a minimal Debian root file system as data.
type Debian struct {
	// Suite is the release (bookworm).
	Suite string
	// Packages are installed beside debootstrap's minbase variant.
	Packages []string
	// Passwd and Group lines appended to /etc/passwd and /etc/group.
	Passwd, Group []string
}

// rootRecipe is part of every root's cache key: bump it when what a root
// holds changes other than through Debian's fields (debootstrap flags,
// what trim removes, the fix-ups).
const rootRecipe = 2

// DefaultMirror is the Debian archive debootstrap downloads from.
const DefaultMirror = "http://deb.debian.org/debian"

// E2EDebian is the root of agnhost, glibc-dns-testing, nginx and
// flatnet:dev: what the e2e suite's pods shell out to (dig, getent, curl,
// nc, ip, ss, socat, ps, seq, hostname; GNU wget, as bookworm's busybox
// 1.35 wget dies of SIGSEGV on the -T the Services specs pass), nginx, and
// what flatnet's DaemonSet runs (nft, iptables, sh), plus busybox-static
// for the busybox image. One root for all keeps one base layer per node.
var E2EDebian = Debian{
	Suite: "bookworm",
	Packages: []string{
		"bind9-dnsutils", "busybox-static", "curl", "iproute2", "iptables",
		"netcat-openbsd", "nftables", "nginx-light", "procps", "socat", "wget",
	},
	// agnhost's Dockerfile adds these for the SupplementalGroups spec.
	Passwd: []string{"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh"},
	Group:  []string{"user-defined-in-image:x:1000:", "group-defined-in-image:x:50000:user-defined-in-image"},
}

// Key is the cache key of d: its contents, the recipe and the machine's
// architecture (not the mirror: any mirror gives the same packages).
func (d Debian) Key() string {
	pkgs := slices.Clone(d.Packages)
	slices.Sort(pkgs)
	h := sha256.New()
	fmt.Fprintf(h, "recipe %d\nsuite %s\narch %s\npackages %s\npasswd %q\ngroup %q\n",
		rootRecipe, d.Suite, runtime.GOARCH, strings.Join(pkgs, ","), d.Passwd, d.Group)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Root is a built Debian root in the cache.
type Root struct {
	// Dir is the root file system.
	Dir string
	// Layer is Dir as a gzip-compressed layer file (for Spec.Base).
	Layer string
	// Built is true when this call built it, Took how long that took.
	Built bool
	Took  time.Duration
}

// debootstrapArgv is the first stage: download and unpack into target,
// nothing run inside it yet.
func (d Debian) debootstrapArgv(target, mirror string) []string {
	pkgs := slices.Clone(d.Packages)
	slices.Sort(pkgs)
	return append(privateNS(), "debootstrap", "--foreign", "--variant=minbase",
		"--include="+strings.Join(pkgs, ","), d.Suite, target, mirror)
}

// secondStageArgv installs the unpacked packages inside target.
func secondStageArgv(target string) []string {
	return append(privateNS(), "chroot", target, "/debootstrap/debootstrap", "--second-stage")
}

// privateNS runs a command in mount and PID namespaces of its own (see
// the design note).
func privateNS() []string {
	return []string{"unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private", "--"}
}

// policyRC refuses every service start by a package's script (Debian's
// policy-rc.d interface): nginx's postinst must not start a server.
const policyRC = "#!/bin/sh\nexit 101\n"

// Ensure returns d's root under cacheDir, building it when missing. log
// gets progress lines.
func (d Debian) Ensure(ctx context.Context, cacheDir, mirror string, log io.Writer) (Root, error) {
	if mirror == "" {
		mirror = DefaultMirror
	}
	name := "debian-" + d.Suite + "-" + d.Key()
	final := filepath.Join(cacheDir, name)
	r := Root{Dir: filepath.Join(final, "root"), Layer: filepath.Join(final, "layer.tar.gz")}
	if _, err := os.Stat(filepath.Join(final, "done")); err == nil {
		return r, nil
	}
	if os.Geteuid() != 0 {
		return r, fmt.Errorf("building the Debian root %s: debootstrap needs root (run as root once; later runs use the cache)", final)
	}
	for _, c := range []string{"debootstrap", "unshare", "chroot"} {
		if _, err := exec.LookPath(c); err != nil {
			return r, fmt.Errorf("building the Debian root: %s not found: run `make deps` (hack/deps.sh installs debootstrap)", c)
		}
	}
	if err := checkMirror(ctx, mirror, d.Suite); err != nil {
		return r, err
	}
	start := time.Now()
	fmt.Fprintf(log, "building the Debian %s root with debootstrap from %s (about a minute; once)\n", d.Suite, mirror)
	tmp, err := os.MkdirTemp(cacheDir, "."+name+".tmp-")
	if err != nil {
		return r, err
	}
	defer removeUnmounted(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return r, err
	}
	logFile := filepath.Join(cacheDir, name+".log")
	if err := d.build(ctx, filepath.Join(tmp, "root"), mirror, logFile); err != nil {
		return r, err
	}
	fmt.Fprintf(log, "Debian root: debootstrap took %s; writing its layer\n", time.Since(start).Round(time.Second))
	if err := WriteDirLayer(filepath.Join(tmp, "layer.tar.gz"), filepath.Join(tmp, "root"), rootSkip); err != nil {
		return r, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "done"), []byte(d.Key()+"\n"), 0o644); err != nil {
		return r, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return r, fmt.Errorf("moving the Debian root into place: %w", err)
	}
	removeStaleRoots(cacheDir, name)
	r.Built, r.Took = true, time.Since(start)
	return r, nil
}

// rootSkip leaves out what the runtime mounts over (the contents of /dev,
// /proc and /sys; the directories stay).
func rootSkip(rel string) bool { return underAny(rel, "dev", "proc", "sys") }

// build runs both debootstrap stages into target, then trims it.
func (d Debian) build(ctx context.Context, target, mirror, logFile string) error {
	lf, err := os.Create(logFile)
	if err != nil {
		return err
	}
	defer lf.Close()
	run := func(argv []string) error {
		fmt.Fprintf(lf, "+ %s\n", strings.Join(argv, " "))
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive"}
		cmd.Stdout, cmd.Stderr = lf, lf
		err := cmd.Run()
		if merr := checkNoMounts(target); merr != nil {
			err = errors.Join(err, merr)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("debootstrap: %w", errors.Join(ctx.Err(), err))
		}
		if err != nil {
			return fmt.Errorf("%s: %w (log %s:\n%s)", argv[len(privateNS())], err, logFile, tail(logFile, 15))
		}
		return nil
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := run(d.debootstrapArgv(target, mirror)); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(target, "usr/sbin/policy-rc.d"), []byte(policyRC), 0o755); err != nil {
		return err
	}
	if err := run(secondStageArgv(target)); err != nil {
		return err
	}
	return d.trim(target)
}

// trim removes what a container image has no use for (documentation but
// the copyright files, apt's lists and downloaded packages, logs) and
// writes the files the runtime replaces anyway with neutral content, so the
// build machine's resolv.conf and name stay out of the image.
func (d Debian) trim(root string) error {
	var errs []error
	for _, pattern := range []string{
		"usr/share/man/*", "usr/share/info/*", "usr/share/lintian/*",
		"var/lib/apt/lists/*", "var/cache/apt/*", "var/cache/debconf/*-old",
		"var/lib/dpkg/*-old", "var/log/*", "usr/sbin/policy-rc.d", "debootstrap",
	} {
		matches, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, m := range matches {
			errs = append(errs, os.RemoveAll(m))
		}
	}
	docs, _ := filepath.Glob(filepath.Join(root, "usr/share/doc/*/*"))
	for _, m := range docs {
		if filepath.Base(m) != "copyright" {
			errs = append(errs, os.RemoveAll(m))
		}
	}
	// Translations (a fifth of the root); locale.alias stays.
	locales, _ := filepath.Glob(filepath.Join(root, "usr/share/locale/*"))
	for _, m := range locales {
		if st, err := os.Lstat(m); err == nil && st.IsDir() {
			errs = append(errs, os.RemoveAll(m))
		}
	}
	for file, content := range map[string]string{
		"etc/resolv.conf": "",
		"etc/hostname":    "localhost\n",
		"etc/hosts":       "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	} {
		p := filepath.Join(root, file)
		os.Remove(p) // a symlink (systemd-resolved) must not be followed out
		errs = append(errs, os.WriteFile(p, []byte(content), 0o644))
	}
	errs = append(errs, appendLines(filepath.Join(root, "etc/passwd"), d.Passwd),
		appendLines(filepath.Join(root, "etc/group"), d.Group))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("trimming the Debian root: %w", err)
	}
	return nil
}

func appendLines(file string, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	return errors.Join(err, f.Close())
}

// ErrMirror is returned (wrapped) when the Debian mirror does not answer.
var ErrMirror = errors.New("cannot reach the Debian mirror")

// checkMirror fetches the suite's Release file: a clear error up front
// instead of debootstrap's after a timeout.
func checkMirror(ctx context.Context, mirror, suite string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	url := strings.TrimSuffix(mirror, "/") + "/dists/" + suite + "/Release"
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, url, nil)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrMirror, url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s: %w (use another with --mirror)", ErrMirror, url, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %s: %s (use another with --mirror)", ErrMirror, url, resp.Status)
	}
	return nil
}

// checkNoMounts unmounts (detaching) anything still mounted at or below
// dir and fails if that did not work. With debootstrap in its own mount
// namespace nothing is ever left; this is the second line of defence.
func checkNoMounts(dir string) error {
	for range 3 {
		n, err := mountinfo.UnmountUnder(dir)
		if err == nil && n == 0 {
			return nil
		}
	}
	return fmt.Errorf("file systems still mounted below %s: unmount them (see /proc/self/mountinfo) before removing it", dir)
}

// removeUnmounted removes dir unless something is mounted below it.
func removeUnmounted(dir string) {
	if checkNoMounts(dir) == nil {
		os.RemoveAll(dir)
	}
}

// removeStaleRoots removes the roots of other keys (an older recipe or
// package list) and their logs.
func removeStaleRoots(cacheDir, keep string) {
	old, _ := filepath.Glob(filepath.Join(cacheDir, "debian-*"))
	for _, o := range old {
		if b := filepath.Base(o); b != keep && b != keep+".log" {
			removeUnmounted(o)
		}
	}
}

// tail is the last n lines of file.
func tail(file string, n int) string {
	b, _ := os.ReadFile(file)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
