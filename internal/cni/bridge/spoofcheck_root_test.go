package bridge

import (
	"context"
	"net"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/cni/ipmasq"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/nft/nfnl/nfnltest"
)

// TestRootSpoofSameAsNFT runs the same macspoofchk operations through the
// nft binary (the text path) in one namespace and over netlink (the
// default) in another: `nft list table bridge flatnet-cni-spoofchk` must
// be identical after each; then each path removes what the other wrote.
func TestRootSpoofSameAsNFT(t *testing.T) {
	viaExec, viaNL := nfnltest.Sides(t, knftables.BridgeFamily, spoofTable, func(r *nft.Runner) *spoofChecker {
		r.Classify = ipmasq.Classify
		return &spoofChecker{nft: r}
	}, newSpoofChecker)
	ctx := context.Background()
	macA, _ := net.ParseMAC("0a:58:0a:01:00:05")
	macB, _ := net.ParseMAC("0a:58:0a:01:00:06")
	nfnltest.Same(t, knftables.BridgeFamily, spoofTable, viaExec, viaNL, []nfnltest.Step[*spoofChecker]{
		{Name: "setup a", Do: func(s *spoofChecker) error { return s.Setup(ctx, "net", "a", "eth0", "vethA", macA) }},
		{Name: "setup a again", Do: func(s *spoofChecker) error { return s.Setup(ctx, "net", "a", "eth0", "vethA", macA) }},
		{Name: "setup b", Do: func(s *spoofChecker) error { return s.Setup(ctx, "net", "b", "eth0", "vethB", macB) }},
		{Name: "setup c on other", Do: func(s *spoofChecker) error { return s.Setup(ctx, "other", "c", "eth0", "vethC", macB) }},
		{Name: "check a", Do: func(s *spoofChecker) error { return s.Check(ctx, "net", "a", "eth0", "vethA", macA) }},
		{Name: "d takes vethA", Do: func(s *spoofChecker) error { return s.Setup(ctx, "net", "d", "eth0", "vethA", macB) }},
		{Name: "teardown a", Do: func(s *spoofChecker) error { return s.Teardown(ctx, "net", "a", "eth0") }},
		{Name: "GC net keeping b", Do: func(s *spoofChecker) error {
			return s.GC(ctx, "net", map[[2]string]bool{{"b", "eth0"}: true})
		}},
		{Name: "teardown b", Do: func(s *spoofChecker) error { return s.Teardown(ctx, "net", "b", "eth0") }},
	})
	list := func(ns string) string { return nfnltest.List(t, ns, knftables.BridgeFamily, spoofTable) }

	// A node switching binaries: what one path wrote, the other removes.
	if err := netns.Do(viaExec.NS, func() error {
		nl, err := newSpoofChecker()
		if err != nil {
			return err
		}
		for _, pair := range [][2]*spoofChecker{{viaExec.V, nl}, {nl, viaExec.V}} {
			if err := pair[0].Setup(ctx, "net", "e", "eth0", "vethE", macA); err != nil {
				return err
			}
			if err := pair[1].Check(ctx, "net", "e", "eth0", "vethE", macA); err != nil {
				return err
			}
			if err := pair[1].Teardown(ctx, "net", "e", "eth0"); err != nil {
				return err
			}
			if got := list(viaExec.NS); strings.Contains(got, spoofChain("net", "e", "eth0")) || strings.Contains(got, "vethE") {
				t.Errorf("e's rules survived a teardown by the other path:\n%s", got)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
