package bridge

import (
	"context"
	"net"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

func sortedDump(f *knftables.Fake, names map[string]string) string {
	d := f.Dump()
	for from, to := range names {
		d = strings.ReplaceAll(d, from, to)
	}
	lines := strings.Split(strings.TrimSpace(d), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func TestSpoofChecker(t *testing.T) {
	ctx := context.Background()
	f := knftables.NewFake(knftables.BridgeFamily, spoofTable)
	sc := &spoofChecker{nft: f}
	macA, _ := net.ParseMAC("02:00:00:00:00:0a")
	macB, _ := net.ParseMAC("02:00:00:00:00:0b")
	names := map[string]string{
		spoofChain("net", "a", "eth0"): "<a>",
		spoofChain("net", "b", "eth0"): "<b>",
	}
	if err := sc.Setup(ctx, "net", "a", "eth0", "vethA", macA); err != nil {
		t.Fatal(err)
	}
	if err := sc.Setup(ctx, "net", "b", "eth0", "vethB", macB); err != nil {
		t.Fatal(err)
	}
	if err := sc.Setup(ctx, "net", "b", "eth0", "vethB", macB); err != nil {
		t.Fatal(err)
	}
	want := `add chain bridge flatnet-cni-spoofchk <a> { comment "net: net, if: eth0, id: a" ; }
add chain bridge flatnet-cni-spoofchk <b> { comment "net: net, if: eth0, id: b" ; }
add chain bridge flatnet-cni-spoofchk prerouting { type filter hook prerouting priority -300 ; }
add element bridge flatnet-cni-spoofchk ports { "vethA" : goto <a> }
add element bridge flatnet-cni-spoofchk ports { "vethB" : goto <b> }
add map bridge flatnet-cni-spoofchk ports { type ifname : verdict ; }
add rule bridge flatnet-cni-spoofchk <a> drop
add rule bridge flatnet-cni-spoofchk <a> ether saddr 02:00:00:00:00:0a return comment "mac 02:00:00:00:00:0a"
add rule bridge flatnet-cni-spoofchk <b> drop
add rule bridge flatnet-cni-spoofchk <b> ether saddr 02:00:00:00:00:0b return comment "mac 02:00:00:00:00:0b"
add rule bridge flatnet-cni-spoofchk prerouting iifname vmap @ports
add table bridge flatnet-cni-spoofchk { comment "flatnet CNI bridge macspoofchk" ; }`
	if d := cmp.Diff(want, sortedDump(f, names)); d != "" {
		t.Fatalf("after Setup (-want +got):\n%s", d)
	}
	if err := sc.Check(ctx, "net", "a", "eth0", "vethA", macA); err != nil {
		t.Errorf("Check: %v", err)
	}
	err := sc.Check(ctx, "net", "a", "eth0", "vethA", macB)
	if code, _ := cnierr.Code(err); code != cnierr.CheckFailed {
		t.Errorf("Check with the wrong MAC: %v", err)
	}
	if err := sc.Teardown(ctx, "net", "a", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := sc.Teardown(ctx, "net", "a", "eth0"); err != nil {
		t.Fatal(err)
	}
	dump := sortedDump(f, names)
	if strings.Contains(dump, "<a>") || !strings.Contains(dump, "<b>") {
		t.Errorf("after Teardown(a):\n%s", dump)
	}
	// GC with nothing valid removes b.
	if err := sc.GC(ctx, "net", nil); err != nil {
		t.Fatal(err)
	}
	if dump := sortedDump(f, names); strings.Contains(dump, "<b>") {
		t.Errorf("after GC:\n%s", dump)
	}
}
