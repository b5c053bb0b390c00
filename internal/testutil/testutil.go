// Package testutil holds helpers for flatnet's root tests: skipping with a
// reason, uniquely named namespaces that are removed even when a test
// fails, the host-range guard, and the multi-call CNI binary built once per
// test process and installed under every plugin name.
package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/flatnet/flatnet/internal/cni/parking"
	"github.com/flatnet/flatnet/internal/hostroutes"
	"github.com/flatnet/flatnet/internal/netns"
)

// PluginNames are the names the multi-call binary answers to.
var PluginNames = []string{"bridge", "host-local", "loopback", "ptp", "macvlan", "bandwidth", "portmap", "flatnet", "flatnet-policy"}

// Skip is the only way a root or lab test skips: outside CI it skips t with
// the reason; in CI (CI=true, which .ci/run exports) nothing may skip, so it
// fails t with the same reason instead. The reason should say what is
// missing and how to get it.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI must run this test, but: "+format, args...)
	}
	t.Skipf("skipping: "+format, args...)
}

// InCI reports whether the tests run under CI (CI=true).
func InCI() bool { return os.Getenv("CI") == "true" }

// RequireRoot skips t (fails it in CI) unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root (network namespaces, netlink); run `sudo make test`")
	}
}

// Name returns prefix followed by random hex, at most 15 bytes (IFNAMSIZ-1).
func Name(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	n := prefix + hex.EncodeToString(b)
	if len(n) > 15 {
		n = n[:15]
	}
	return n
}

// NewNetNS creates a uniquely named network namespace (prefix "fnt") with
// lo up and removes it when t ends. It returns the namespace's path.
func NewNetNS(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	name := Name("fnt")
	path, err := netns.Create(name)
	if err != nil {
		t.Fatalf("creating netns: %v", err)
	}
	t.Cleanup(func() {
		// CNI plugins that ran in it may have left a marker of parked
		// links (internal/cni/parking); they go with the namespace.
		if err := parking.Forget(path); err != nil {
			t.Errorf("netns %s: %v", name, err)
		}
		if err := netns.Delete(name); err != nil {
			t.Errorf("deleting netns %s: %v", name, err)
		}
	})
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v: %s", name, err, out)
	}
	return path
}

// NSName returns the iproute2 name of a namespace path from NewNetNS.
func NSName(path string) string { return filepath.Base(path) }

// LabRanges are what labs take in the host namespace with their default
// flags (internal/lab: DefaultClusterCIDR, the underlays, DefaultLBPool).
// make test runs test/e2e's labs beside the other packages' root tests,
// so those must keep out of them.
var LabRanges = []netip.Prefix{
	netip.MustParsePrefix("10.244.0.0/16"),
	netip.MustParsePrefix("10.250.0.0/16"),
	netip.MustParsePrefix("10.251.0.0/24"),
}

// RequireFreeRange fails t when any of cidrs overlaps a network the machine
// is on: tests must never use the host's own ranges. Nor one of
// LabRanges: a lab running beside the test may take it at any moment.
func RequireFreeRange(t testing.TB, cidrs ...string) {
	t.Helper()
	var ps []netip.Prefix
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			t.Fatalf("bad test range %q: %v", c, err)
		}
		for _, l := range LabRanges {
			if p.Overlaps(l) {
				t.Fatalf("test range %s overlaps %s, which labs take (testutil.LabRanges; test/e2e runs beside this test): pick another", p, l)
			}
		}
		ps = append(ps, p)
	}
	// Our own test interfaces (bridges named fnt*/fnb*...) are ignored.
	if err := hostroutes.EnsureFree(ps, "fn"); err != nil {
		t.Fatalf("refusing to run: %v", err)
	}
}

// Run runs argv and fails t with its output on error.
func Run(t testing.TB, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// RunIn runs argv inside the namespace at nsPath (ip netns exec) and fails
// t with its output on error.
func RunIn(t testing.TB, nsPath string, argv ...string) string {
	t.Helper()
	return Run(t, append([]string{"ip", "netns", "exec", NSName(nsPath)}, argv...)...)
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// CNIPath returns a directory holding flatnet-cni under every plugin name,
// for use as CNI_PATH. FLATNET_CNI_PATH overrides it (the Makefile sets it
// to a `make install-cni` result); otherwise the binary is built once per
// test process and removed by Main.
func CNIPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("FLATNET_CNI_PATH"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "flatnet-cni-test-")
		if buildErr != nil {
			return
		}
		bin := filepath.Join(buildDir, "flatnet-cni")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/flatnet/flatnet/cmd/flatnet-cni")
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as make build makes it
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building flatnet-cni: %v\n%s", err, out)
			return
		}
		for _, n := range PluginNames {
			if err := os.Symlink("flatnet-cni", filepath.Join(buildDir, n)); err != nil {
				buildErr = err
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Main runs the tests of a package and removes what CNIPath built. Use it
// as: func TestMain(m *testing.M) { testutil.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// CIDR parses "ip/len" keeping the address (not the network), IPv4 in its
// 4-byte form; it panics on a bad literal.
func CIDR(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	if ip.To4() != nil {
		ip = ip.To4()
	}
	n.IP = ip
	return *n
}
