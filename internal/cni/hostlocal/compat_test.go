package hostlocal_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/testutil"
)

// refHostLocal returns the reference host-local (containernetworking/
// plugins, testutil.RefCNIVersion), built once and cached.
func refHostLocal(t *testing.T) string {
	t.Helper()
	return filepath.Join(testutil.RefCNI(t, "ipam/host-local"), "host-local")
}

// TestReferenceCompatibility drives the reference host-local and ours on
// one dataDir, alternating, and shows that neither double-issues an
// address, each sees, checks, releases and garbage-collects the other's
// reservations, and the files are byte-for-byte the same format.
func TestReferenceCompatibility(t *testing.T) {
	ref := refHostLocal(t)
	ours := ourBinary(t)
	dd := t.TempDir()
	c := conf(t, dd, "1.1.0", `[[{"subnet":"10.85.0.0/28"}],[{"subnet":"fd00:85::/124"}]]`)
	run := func(bin, verb, id, args string) ([]byte, error) {
		return execPlugin(bin, verb, c, id, "eth0", args)
	}
	name := map[string]string{ref: "reference", ours: "flatnet"}

	// Alternate ADDs: each continues after the other's last_reserved_ip.
	seq := []struct{ bin, id, want string }{
		{ref, "r1", "10.85.0.2/28"},
		{ours, "o1", "10.85.0.3/28"},
		{ref, "r2", "10.85.0.4/28"},
		{ours, "o2", "10.85.0.5/28"},
	}
	for i, s := range seq {
		out, err := run(s.bin, "ADD", s.id, "")
		if err != nil {
			t.Fatalf("%s ADD %s: %v", name[s.bin], s.id, err)
		}
		want := []string{s.want, fmt.Sprintf("fd00:85::%d/124", i+2)}
		if diff := cmp.Diff(want, resultIPs(t, out)); diff != "" {
			t.Errorf("%s ADD %s (-want +got):\n%s", name[s.bin], s.id, diff)
		}
	}
	wantFiles := []string{
		"10.85.0.2=r1\r\neth0", "10.85.0.3=o1\r\neth0", "10.85.0.4=r2\r\neth0", "10.85.0.5=o2\r\neth0",
		"fd00:85::2=r1\r\neth0", "fd00:85::3=o1\r\neth0", "fd00:85::4=r2\r\neth0", "fd00:85::5=o2\r\neth0",
		"last_reserved_ip.0=10.85.0.5", "last_reserved_ip.1=fd00:85::5", "lock=",
	}
	if diff := cmp.Diff(wantFiles, files(t, dd)); diff != "" {
		t.Errorf("shared dataDir (-want +got):\n%s", diff)
	}
	netDir := filepath.Join(dd, "testnet")
	for _, f := range []string{"10.85.0.2", "10.85.0.3"} {
		fi, _ := os.Stat(filepath.Join(netDir, f))
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v", f, fi.Mode())
		}
	}

	// Static requests of the other's addresses are refused by both.
	if _, err := run(ours, "ADD", "x", "IP=10.85.0.2"); !isCode(err, 102) {
		t.Errorf("ours, static request of a reference-made reservation: %v, want code 102", err)
	}
	if _, err := run(ref, "ADD", "x", "IP=10.85.0.3"); err == nil {
		t.Error("reference handed out our reservation 10.85.0.3 on a static request")
	}
	// The same attachment asking again is refused by ours (as by the
	// reference) when the reservation was made by the other plugin.
	if _, err := run(ours, "ADD", "r1", ""); !isCode(err, 102) {
		t.Errorf("ours, second ADD of reference-made r1: %v, want code 102", err)
	}
	if _, err := run(ref, "ADD", "o1", ""); err == nil {
		t.Error("reference gave o1 (ours) a second address")
	}
	if diff := cmp.Diff(wantFiles, files(t, dd)); diff != "" {
		t.Errorf("refused ADDs changed the dataDir (-want +got):\n%s", diff)
	}

	// CHECK across plugins.
	if _, err := run(ours, "CHECK", "r1", ""); err != nil {
		t.Errorf("ours CHECK of reference-made r1: %v", err)
	}
	if _, err := run(ref, "CHECK", "o1", ""); err != nil {
		t.Errorf("reference CHECK of our o1: %v", err)
	}

	// DEL across plugins.
	if _, err := run(ours, "DEL", "r1", ""); err != nil {
		t.Fatalf("ours DEL r1: %v", err)
	}
	if _, err := run(ref, "DEL", "o1", ""); err != nil {
		t.Fatalf("reference DEL o1: %v", err)
	}
	for _, gone := range []string{"10.85.0.2", "fd00:85::2", "10.85.0.3", "fd00:85::3"} {
		if _, err := os.Stat(filepath.Join(netDir, gone)); !os.IsNotExist(err) {
			t.Errorf("%s still reserved after DEL: %v", gone, err)
		}
	}

	// GC: ours frees the reference-made r2; the reference frees our o2.
	gc := func(bin string, valid string) {
		t.Helper()
		g := conf(t, dd, "1.1.0", `[[{"subnet":"10.85.0.0/28"}],[{"subnet":"fd00:85::/124"}]]`,
			`"cni.dev/valid-attachments":[`+valid+`],`)
		if _, err := execPlugin(bin, "GC", g, "", "", ""); err != nil {
			t.Fatalf("%s GC: %v", name[bin], err)
		}
	}
	gc(ours, `{"containerID":"o2","ifname":"eth0"}`)
	if diff := cmp.Diff([]string{"10.85.0.5=o2\r\neth0", "fd00:85::5=o2\r\neth0", "last_reserved_ip.0=10.85.0.5", "last_reserved_ip.1=fd00:85::5", "lock="}, files(t, dd)); diff != "" {
		t.Errorf("after our GC (-want +got):\n%s", diff)
	}
	gc(ref, "")
	if diff := cmp.Diff([]string{"last_reserved_ip.0=10.85.0.5", "last_reserved_ip.1=fd00:85::5", "lock="}, files(t, dd)); diff != "" {
		t.Errorf("after reference GC of our reservations (-want +got):\n%s", diff)
	}

	// After all that, round robin continues where either left off.
	out, err := run(ours, "ADD", "o3", "")
	if err != nil || resultIPs(t, out)[0] != "10.85.0.6/28" {
		t.Errorf("ours ADD o3: %s %v", out, err)
	}
}

// TestReferenceConcurrent: 10 reference and 10 flatnet processes ADD at
// once on one dataDir; the shared flock (and O_EXCL files) keep every
// address distinct.
func TestReferenceConcurrent(t *testing.T) {
	ref := refHostLocal(t)
	ours := ourBinary(t)
	dd := t.TempDir()
	c := conf(t, dd, "1.1.0", `[[{"subnet":"10.86.0.0/27"}]]`)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got []string
	for i := 0; i < 20; i++ {
		bin := ours
		if i%2 == 1 {
			bin = ref
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := execPlugin(bin, "ADD", c, fmt.Sprintf("c%02d", i), "eth0", "")
			if err != nil {
				t.Errorf("ADD c%02d: %v", i, err)
				return
			}
			mu.Lock()
			got = append(got, resultIPs(t, out)...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, a := range got {
		if seen[a] {
			t.Errorf("%s handed out twice", a)
		}
		seen[a] = true
	}
	if len(seen) != 20 {
		t.Errorf("%d distinct addresses, want 20: %v", len(seen), got)
	}
	n := 0
	for _, f := range files(t, dd) {
		if strings.HasPrefix(f, "10.86.0.") {
			n++
		}
	}
	if n != 20 {
		t.Errorf("%d reservation files, want 20", n)
	}
}

func isCode(err error, code uint) bool {
	te, ok := err.(*types.Error)
	return ok && te.Code == code
}
