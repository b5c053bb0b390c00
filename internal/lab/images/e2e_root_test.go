package images

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/mountinfo"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestE2EImagesRoot builds the real set into the shared cache (the Debian
// root once, about a minute and a half; later runs find it), checks that a
// second call is all cache hits, then opens each tarball: its name,
// entrypoint and command, its key files, and the programs the e2e suite
// runs, started in a chroot of the flattened image. When hack/build-node.sh
// has built containerd, every tarball is also imported with ctr into a
// throwaway containerd.
func TestE2EImagesRoot(t *testing.T) {
	testutil.RequireRoot(t)
	k8sBin, err := controlplane.CacheBinDir()
	if err != nil {
		t.Fatal(err)
	}
	agnhost, coredns := filepath.Join(k8sBin, "agnhost"), filepath.Join(k8sBin, "coredns")
	if _, err := os.Stat(agnhost); err != nil {
		testutil.Skip(t, "%s not built: run `hack/build-k8s.sh agnhost`", agnhost)
	}
	if _, err := os.Stat(coredns); err != nil {
		testutil.Skip(t, "%s not built: run `hack/build-coredns.sh`", coredns)
	}
	bin, _ := filepath.Abs("../../../bin")
	for _, b := range []string{"flatnet", "flatnet-cni", "flatnet-pause"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			testutil.Skip(t, "%s/%s not built: run `make build`", bin, b)
		}
	}
	cache, err := DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	echo := filepath.Join(k8sBin, "echo-basic")
	if _, err := os.Stat(echo); err != nil {
		t.Logf("%s not built (hack/build-echo-basic.sh): no echo-basic images", echo)
		echo = ""
	}
	cfg := Config{CacheDir: cache, Agnhost: agnhost, CoreDNS: coredns, EchoBasic: echo, FlatnetBin: bin, Log: testLog{t}}
	ts, err := E2E(t.Context(), cfg)
	if errors.Is(err, ErrMirror) {
		testutil.Skip(t, "the Debian root is not cached and debootstrap cannot reach the mirror: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	PrintTable(&table, ts)
	t.Logf("first call:\n%s", table.String())

	start := time.Now()
	again, err := E2E(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	for _, tb := range again {
		if !tb.Cached {
			t.Errorf("%s: rebuilt by a second call with the same inputs", tb.Ref)
		}
	}
	t.Logf("second call (all cached): %s", took)
	if took > time.Minute {
		t.Errorf("a call with everything cached took %s", took)
	}

	checks := map[string]struct {
		config string
		files  []string
		run    string
		// argv runs in a chroot of an image without a shell; its output
		// must hold want.
		argv []string
		want string
	}{
		PauseRef: {config: "[/pause] [] ", files: []string{"pause"}},
		AgnhostRef: {
			config: "[/agnhost] [pause] " + defaultPATH,
			files: []string{"agnhost", "agnhost-2", "coredns", "localhost.crt", "localhost.key", "uploads/", "usr/bin/dig", "usr/bin/curl",
				"usr/bin/nc.openbsd", "usr/bin/getent", "usr/bin/wget", "usr/bin/ping"},
			// ping is busybox's (as on upstream's Alpine); wget, nc
			// and ip Debian's.
			run: "/agnhost --help >/dev/null && /agnhost-2 --help >/dev/null && dig -v && getent hosts localhost && curl --version >/dev/null && " +
				"command -v nc socat ip ss ps seq hostname bash && id user-defined-in-image && getent group group-defined-in-image && " +
				"/coredns -plugins | grep -qx hosts && wget --version | grep -q ^GNU.Wget && [ \"$(readlink -f $(command -v nc))\" = /usr/bin/nc.openbsd ]",
		},
		// The ClusterNetworkPolicy suite's tag: the same image, its
		// containers run `/bin/bash -c "/agnhost porter"` and serve-hostname.
		AgnhostCNPRef: {
			config: "[/agnhost] [pause] " + defaultPATH,
			files:  []string{"agnhost", "agnhost-2", "usr/bin/bash"},
			run:    "/agnhost --help | grep -q porter && /bin/bash -c 'command -v nc ip'",
		},
		GlibcDNSRef: {config: "[] [bash] " + defaultPATH, files: []string{"usr/bin/dig", "usr/bin/getent"}, run: "dig -v && getent hosts localhost"},
		BusyboxRef: {
			config: "[] [sh] " + defaultPATH,
			files:  []string{"bin/busybox", "bin/sh", "bin/wget", "bin/nc", "tmp/"},
			run:    "echo hi | sed s/h/H/ | grep -q Hi && [ -x /bin/wget ] && [ -x /bin/nc ] && seq 1 2 >/dev/null",
		},
		NginxRef: {
			config: "[] [nginx -g daemon off;] " + defaultPATH,
			files:  []string{"usr/sbin/nginx", "etc/nginx/nginx.conf", "etc/nginx/sites-enabled/default"},
			run:    "nginx -t",
		},
		FlatnetRef: {
			config: "[/usr/local/bin/flatnet] [] " + defaultPATH,
			files:  []string{"usr/local/bin/flatnet", "usr/local/bin/flatnet-cni", "usr/sbin/nft"},
			run:    "flatnet --help >/dev/null && nft --version && iptables --version && command -v cp mv ln",
		},
		// The Gateway API suite's coredns runs `-conf /root/Corefile` with
		// forward, log, errors and whoami.
		CoreDNSRef: {config: "[/coredns] [] ", files: []string{"coredns"}, argv: []string{"/coredns", "-plugins"}, want: "whoami"},
		// echo-basic -h fails (no flags) but names itself.
		EchoBasicRef:    {config: "[/echo-basic] [] " + defaultPATH, files: []string{"echo-basic"}},
		EchoBasicDevRef: {config: "[/echo-basic] [] " + defaultPATH, files: []string{"echo-basic"}},
	}
	for _, tb := range ts {
		t.Run(tarballName(tb.Ref), func(t *testing.T) {
			c, ok := checks[tb.Ref]
			if !ok {
				t.Fatalf("no checks for %s", tb.Ref)
			}
			tag, err := name.NewTag(tb.Ref)
			if err != nil {
				t.Fatal(err)
			}
			img, err := tarball.ImageFromPath(tb.Path, &tag)
			if err != nil {
				t.Fatalf("%s has no %s: %v", tb.Path, tb.Ref, err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(cf.Config.Entrypoint, " ", cf.Config.Cmd, " ", strings.Join(cf.Config.Env, " ")); got != c.config {
				t.Errorf("entrypoint, cmd, env: %s, want %s", got, c.config)
			}
			dir := t.TempDir()
			if err := extract(img, dir); err != nil {
				t.Fatal(err)
			}
			for _, f := range c.files {
				if _, err := os.Lstat(filepath.Join(dir, f)); err != nil {
					t.Errorf("no /%s in the image", f)
				}
			}
			if c.argv != nil {
				out, err := exec.Command("chroot", append([]string{dir}, c.argv...)...).CombinedOutput()
				if err != nil || !strings.Contains(string(out), c.want) {
					t.Errorf("in the image: %v: %v, want %q in\n%s", c.argv, err, c.want, out)
				}
			}
			if c.run == "" {
				return
			}
			// nginx -t opens its logs, linked to /dev/std*: the runtime
			// provides /dev, a chroot does not.
			os.MkdirAll(filepath.Join(dir, "dev"), 0o755)
			for _, d := range []string{"dev/stdout", "dev/stderr", "dev/null"} {
				os.WriteFile(filepath.Join(dir, d), nil, 0o666)
			}
			cmd := exec.Command("chroot", dir, "/bin/sh", "-ec", c.run)
			cmd.Env = []string{defaultPATH}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("in the image: %s: %v\n%s", c.run, err, out)
			}
		})
	}
	importWithCtr(t, ts)
}

// extract writes the flattened file system of img into dir. No entry is
// written through a symbolic link (the image's /var/run -> /run must not
// reach the host's).
func extract(img v1.Image, dir string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, h.Name)
		if !strings.HasPrefix(p, dir+"/") {
			return fmt.Errorf("entry %q leaves the directory", h.Name)
		}
		for parent := filepath.Dir(p); parent != dir; parent = filepath.Dir(parent) {
			if st, err := os.Lstat(parent); err == nil && st.Mode()&os.ModeSymlink != 0 {
				return fmt.Errorf("entry %q is below the symbolic link %s", h.Name, parent)
			}
		}
		mode := os.FileMode(h.Mode & 0o777)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, mode|0o700)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeLink:
			err = os.Link(filepath.Join(dir, h.Linkname), p)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode); err == nil {
				_, err = io.Copy(f, tr)
				err = errors.Join(err, f.Close())
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
	}
}

// importWithCtr imports every tarball into a containerd of its own (its
// root, state and socket in a temporary directory, in a mount namespace
// of its own so its snapshot mounts stay there, CRI off) and lists them
// back under their names. Optional: it needs hack/build-node.sh's
// containerd and ctr.
func importWithCtr(t *testing.T, ts []Tarball) {
	out, err := exec.Command("../../../hack/build-node.sh", "--bin-dir").Output()
	nodeBin := strings.TrimSpace(string(out))
	if err != nil || nodeBin == "" {
		t.Logf("not importing with ctr: hack/build-node.sh --bin-dir: %v", err)
		return
	}
	containerd, ctr := filepath.Join(nodeBin, "containerd"), filepath.Join(nodeBin, "ctr")
	for _, b := range []string{containerd, ctr} {
		if _, err := os.Stat(b); err != nil {
			t.Logf("not importing with ctr: %s not built (make node)", b)
			return
		}
	}
	dir, err := os.MkdirTemp("", "flatnet-images-ctr-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"))
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", containerd, "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill() // unshare execs containerd: this PID is containerd
		cmd.Wait()
		logf.Close()
		removeUnmounted(dir)
	})
	ctrRun := func(args ...string) (string, error) {
		out, err := exec.Command(ctr, append([]string{"-a", sock, "-n", "k8s.io"}, args...)...).CombinedOutput()
		return string(out), err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := ctrRun("version"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
			t.Fatalf("containerd did not answer on %s in 30 s:\n%s", sock, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, tb := range ts {
		start := time.Now()
		if out, err := ctrRun("images", "import", tb.Path); err != nil {
			t.Errorf("ctr images import %s: %v\n%s", tb.Path, err, out)
			continue
		}
		t.Logf("ctr import %s: %s", filepath.Base(tb.Path), time.Since(start).Round(time.Millisecond))
	}
	listed, err := ctrRun("images", "ls", "-q")
	if err != nil {
		t.Fatalf("ctr images ls: %v\n%s", err, listed)
	}
	for _, tb := range ts {
		if !strings.Contains("\n"+listed, "\n"+tb.Ref+"\n") {
			t.Errorf("%s not listed by ctr after import:\n%s", tb.Ref, listed)
		}
	}
	du, _ := exec.Command("du", "-sh", filepath.Join(dir, "root")).Output()
	t.Logf("containerd root after importing all: %s", strings.TrimSpace(string(du)))
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestDebootstrapCanceledLeavesNothing cancels a root build during
// debootstrap's second stage (package scripts running in the chroot, with
// its proc and sys mounted in its own namespace): nothing is left mounted
// below the cache, no process of it runs on, and only its log remains.
func TestDebootstrapCanceledLeavesNothing(t *testing.T) {
	testutil.RequireRoot(t)
	cache := t.TempDir()
	d := Debian{Suite: "bookworm", Packages: []string{"curl", "nginx-light"}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	secondStage := make(chan bool, 1)
	go func() {
		defer cancel()
		for ctx.Err() == nil {
			logs, _ := filepath.Glob(filepath.Join(cache, "debian-*.log"))
			for _, l := range logs {
				if b, _ := os.ReadFile(l); bytes.Contains(b, []byte("Installing core packages")) {
					time.Sleep(3 * time.Second) // into the package scripts
					secondStage <- true
					return
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	_, err := d.Ensure(ctx, cache, "", testLog{t})
	if errors.Is(err, ErrMirror) {
		testutil.Skip(t, "debootstrap cannot reach the Debian mirror: %v", err)
	}
	select {
	case <-secondStage:
	default:
		t.Fatalf("the build ended before its second stage: %v", err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want it to say the build was canceled", err)
	}
	if m, err := mountinfo.Under(cache); err != nil || len(m) > 0 {
		t.Errorf("left mounted: %q", m)
	}
	left, _ := filepath.Glob(filepath.Join(cache, "*"))
	hidden, _ := filepath.Glob(filepath.Join(cache, ".*"))
	if len(left) != 1 || !strings.HasSuffix(left[0], ".log") || len(hidden) != 0 {
		t.Errorf("left in the cache: %q %q", left, hidden)
	}
	out, _ := exec.Command("pgrep", "-f", cache).Output()
	if len(out) > 0 {
		t.Errorf("processes left: %s", out)
	}
}
