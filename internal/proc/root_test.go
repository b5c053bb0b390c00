package proc

import (
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		t.Fatalf("stat %s: %v", a, err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		t.Fatalf("stat %s: %v", b, err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// A daemon started with inNetns runs in that namespace, and the caller's
// namespace is unchanged.
func TestStartInNetns(t *testing.T) {
	testutil.RequireRoot(t)
	nsPath := testutil.NewNetNS(t)
	dir := t.TempDir()
	pid, err := Start("in-ns", []string{"sleep", "300"}, nil, dir, nsPath)
	if err != nil {
		t.Fatal(err)
	}
	// Stop before the namespace is deleted (cleanups run last-in first-out).
	t.Cleanup(func() {
		if err := Stop(dir, "in-ns", time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	nsFile := "/proc/" + strconv.Itoa(pid) + "/ns/net"
	if !sameFile(t, nsFile, nsPath) {
		t.Errorf("pid %d is not in netns %s", pid, nsPath)
	}
	if sameFile(t, "/proc/self/ns/net", nsPath) {
		t.Error("the test process ended up in the test netns")
	}
	// The pid file names the namespace; Running and Stop work the same.
	if _, ok := Running(dir, "in-ns"); !ok {
		t.Fatal("not Running")
	}
	rec, err := readRecord(PIDFile(dir, "in-ns"))
	if err != nil || rec.Netns != nsPath {
		t.Errorf("pid file netns %q (%v), want %s", rec.Netns, err, nsPath)
	}
	if err := Stop(dir, "in-ns", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Errorf("pid %d alive after Stop", pid)
	}
}
