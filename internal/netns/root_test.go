package netns_test

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootRunDirWithIproute2 creates namespaces with Create and with
// `ip netns add` in turn, then deletes them all. It runs in a mount
// namespace of its own with a fresh tmpfs on /run, so that /run/netns starts
// as a plain directory, as on a freshly booted machine, and nothing it
// mounts is seen outside. Before Create made /run/netns a shared mount
// point, iproute2's bind of /run/netns onto itself copied the namespace
// Create had mounted, Delete unmounted only the copy, and the file could
// never be removed (EBUSY).
func TestRootRunDirWithIproute2(t *testing.T) {
	if os.Getenv("FLATNET_NETNS_CHILD") == "1" {
		runDirScenario(t)
		return
	}
	testutil.RequireRoot(t)
	for _, tool := range []string{"unshare", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: run hack/deps.sh (%v)", tool, err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount -t tmpfs flatnet-netns-test /run && exec "$0" -test.run='^TestRootRunDirWithIproute2$' -test.v -test.count=1`, self)
	cmd.Env = append(os.Environ(), "FLATNET_NETNS_CHILD=1")
	out, err := cmd.CombinedOutput()
	t.Logf("in a private mount namespace:\n%s", out)
	if err != nil {
		t.Fatalf("scenario failed: %v", err)
	}
}

func runDirScenario(t *testing.T) {
	if _, err := netns.Create("fnt-a"); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "add", "fnt-b").CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	if _, err := netns.Create("fnt-c"); err != nil {
		t.Fatal(err)
	}
	if !sharedMountPoint(t, netns.RunDir) {
		t.Errorf("%s is not a mount point with shared propagation", netns.RunDir)
	}
	for _, n := range []string{"fnt-a", "fnt-b", "fnt-c"} {
		if err := netns.Check(filepath.Join(netns.RunDir, n)); err != nil {
			t.Errorf("%s: %v", n, err)
		}
		if err := netns.Delete(n); err != nil {
			t.Errorf("deleting %s: %v", n, err)
		}
		if _, err := os.Stat(filepath.Join(netns.RunDir, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still present after Delete: %v", n, err)
		}
	}
}

// sharedMountPoint reports whether a mount at dir, the topmost, is shared.
func sharedMountPoint(t *testing.T, dir string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	shared := false
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 || fields[4] != dir {
			continue
		}
		found = true
		shared = false
		for _, opt := range fields[6:] {
			if opt == "-" {
				break
			}
			if strings.HasPrefix(opt, "shared:") {
				shared = true
			}
		}
	}
	return found && shared
}
