package store

import (
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// plant writes raw reservation files like another host-local would.
func plant(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func openTemp(t *testing.T) (*Disk, string) {
	t.Helper()
	root := t.TempDir()
	d, err := Open("mynet", root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, filepath.Join(root, "mynet")
}

func TestDiskLayout(t *testing.T) {
	d, dir := openTemp(t)
	if d.Path() != dir {
		t.Fatalf("Path %s, want %s", d.Path(), dir)
	}
	ok, err := d.Reserve(" c1 ", "eth0", ip("10.1.2.3"), "0")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	ok, err = d.Reserve("c1", "eth0", ip("fd00:1:0:0::a"), "1")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	want := map[string]string{
		"10.1.2.3":           "c1\r\neth0",
		"fd00:1::a":          "c1\r\neth0",
		"last_reserved_ip.0": "10.1.2.3",
		"last_reserved_ip.1": "fd00:1::a",
		"lock":               "",
	}
	got := map[string]string{}
	for _, n := range names(t, dir) {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		got[n] = string(b)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layout (-want +got):\n%s", diff)
	}
	fi, _ := os.Stat(filepath.Join(dir, "10.1.2.3"))
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("reservation mode %v, want 0600 like the reference", fi.Mode())
	}
	if l, ok := d.LastReservedIP("1"); !ok || l != ip("fd00:1::a") {
		t.Errorf("LastReservedIP(1) = %v %v", l, ok)
	}
	if _, ok := d.LastReservedIP("7"); ok {
		t.Error("LastReservedIP of an unknown set")
	}
	// Exclusive: a second Reserve of the same address fails softly and
	// keeps the first holder.
	ok, err = d.Reserve("c2", "eth0", ip("10.1.2.3"), "0")
	if err != nil || ok {
		t.Fatalf("double reserve: %v %v", ok, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "10.1.2.3")); string(b) != "c1\r\neth0" {
		t.Errorf("holder overwritten: %q", b)
	}
}

func TestDiskReadsForeignFiles(t *testing.T) {
	d, dir := openTemp(t)
	plant(t, dir, map[string]string{
		"10.0.0.2":           "a\r\neth0",
		"10.0.0.3":           "a\r\nnet1\n", // trailing white space ignored, like the reference
		"10.0.0.4":           "legacy-id",
		"fd00::2":            "a\r\neth0",
		"last_reserved_ip.0": "10.0.0.4",
		"README":             "a\r\neth0",
		"fd00:0::9":          "a\r\neth0", // not a name any host-local writes
	})
	os.Mkdir(filepath.Join(dir, "10.0.0.9"), 0o755)
	all, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	want := []Reservation{
		{IP: ip("10.0.0.2"), ContainerID: "a", IfName: "eth0"},
		{IP: ip("10.0.0.3"), ContainerID: "a", IfName: "net1"},
		{IP: ip("10.0.0.4"), ContainerID: "legacy-id", Legacy: true},
		{IP: ip("fd00::2"), ContainerID: "a", IfName: "eth0"},
	}
	if diff := cmp.Diff(want, all, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
	got, _ := d.GetByID("a", "eth0")
	if diff := cmp.Diff([]string{"10.0.0.2", "fd00::2"}, strs(got)); diff != "" {
		t.Errorf("GetByID (-want +got):\n%s", diff)
	}
	got, _ = d.GetByID("legacy-id", "eth0")
	if diff := cmp.Diff([]string{"10.0.0.4"}, strs(got)); diff != "" {
		t.Errorf("GetByID legacy (-want +got):\n%s", diff)
	}
}

func strs(a []netip.Addr) []string {
	var out []string
	for _, x := range a {
		out = append(out, x.String())
	}
	sort.Strings(out)
	return out
}

// storeContract runs the behaviour both stores must share.
func storeContract(t *testing.T, s Store, snapshot func() []string) {
	t.Helper()
	for _, r := range []struct {
		id, ifn, ip string
	}{{"a", "eth0", "10.0.0.2"}, {"a", "net1", "10.0.0.3"}, {"b", "eth0", "10.0.0.4"}, {"a", "eth0", "fd00::2"}} {
		if ok, err := s.Reserve(r.id, r.ifn, ip(r.ip), "0"); !ok || err != nil {
			t.Fatalf("Reserve %v: %v %v", r, ok, err)
		}
	}
	if ok, _ := s.Reserve("z", "eth0", ip("10.0.0.4"), "0"); ok {
		t.Fatal("reserved a taken address")
	}
	if l, _ := s.LastReservedIP("0"); l != ip("fd00::2") {
		t.Errorf("last = %v", l)
	}
	// ReleaseByID frees exactly (id, ifname).
	if err := s.ReleaseByID("a", "eth0"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.0.0.3", "10.0.0.4"}, snapshot()); diff != "" {
		t.Errorf("after ReleaseByID (-want +got):\n%s", diff)
	}
	// Nothing held: success, nothing changes.
	if err := s.ReleaseByID("a", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseByID("nobody", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ip("10.9.9.9")); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ip("10.0.0.3")); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.0.0.4"}, snapshot()); diff != "" {
		t.Errorf("after Release (-want +got):\n%s", diff)
	}
}

func TestContractDisk(t *testing.T) {
	d, dir := openTemp(t)
	storeContract(t, d, func() []string {
		var out []string
		for _, n := range names(t, dir) {
			if _, err := netip.ParseAddr(n); err == nil {
				out = append(out, n)
			}
		}
		sort.Strings(out)
		return out
	})
}

func TestContractFake(t *testing.T) {
	f := NewFake()
	storeContract(t, f, func() []string { return strs(f.Reserved()) })
}

func TestReleaseByIDLegacyFallback(t *testing.T) {
	for _, s := range []struct {
		name string
		mk   func(t *testing.T) (Store, func() []string)
	}{
		{"disk", func(t *testing.T) (Store, func() []string) {
			d, dir := openTemp(t)
			plant(t, dir, map[string]string{"10.0.0.2": "c\r\neth0", "10.0.0.3": "c", "10.0.0.4": "d"})
			return d, func() []string { r, _ := d.List(); return resIPs(r) }
		}},
		{"fake", func(t *testing.T) (Store, func() []string) {
			f := NewFake()
			f.Set(ip("10.0.0.2"), "c\r\neth0")
			f.Set(ip("10.0.0.3"), "c")
			f.Set(ip("10.0.0.4"), "d")
			return f, func() []string { return strs(f.Reserved()) }
		}},
	} {
		t.Run(s.name, func(t *testing.T) {
			st, snap := s.mk(t)
			// Exact match first: the legacy file of the same ID stays.
			st.ReleaseByID("c", "eth0")
			if diff := cmp.Diff([]string{"10.0.0.3", "10.0.0.4"}, snap()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			// No exact match: legacy reservations of the ID go.
			st.ReleaseByID("c", "eth0")
			if diff := cmp.Diff([]string{"10.0.0.4"}, snap()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func resIPs(rs []Reservation) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.IP.String())
	}
	sort.Strings(out)
	return out
}

// TestLockExcludes: the lock is a flock on DIR/lock held per open file, so
// a second store (as another goroutine or process would open) waits, and
// a raw flock (what the reference's go-filemutex does) is refused.
func TestLockExcludes(t *testing.T) {
	root := t.TempDir()
	d1, err := Open("n", root)
	if err != nil {
		t.Fatal(err)
	}
	defer d1.Close()
	d2, err := Open("n", root)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if err := d1.Lock(); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(filepath.Join(root, "n", "lock"), unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Fatalf("foreign flock while locked: %v, want EWOULDBLOCK", err)
	}
	got := make(chan struct{})
	released := make(chan struct{})
	go func() {
		defer close(released)
		d2.Lock()
		close(got)
		d2.Unlock()
	}()
	select {
	case <-got:
		t.Fatal("second store got the lock while the first held it")
	case <-time.After(100 * time.Millisecond):
	}
	d1.Unlock()
	<-got // must now succeed (the test would hang, and time out, if not)
	<-released
}

func TestOpenErrors(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := Open("n", file); err == nil {
		t.Fatal("Open under a regular file succeeded")
	}
	if Dir("n", "") != filepath.Join(DefaultDataDir, "n") {
		t.Errorf("default dir %s", Dir("n", ""))
	}
}

func TestDiskLongContainerID(t *testing.T) {
	d, _ := openTemp(t)
	long := strings.Repeat("x", 3000)
	if ok, err := d.Reserve(long, "eth0", ip("10.0.0.2"), "0"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	got, err := d.GetByID(long, "eth0")
	if err != nil || len(got) != 1 {
		t.Fatalf("GetByID of a 3000-byte ID: %v %v", got, err)
	}
	all, _ := d.List()
	if len(all) != 1 || all[0].ContainerID != long || all[0].IfName != "eth0" {
		t.Fatalf("List: %+v", all)
	}
}
