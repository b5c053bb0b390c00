package agent

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/userspace"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootProxyModeSwitch: an agent starting in one mode removes what
// another mode left in its namespace: the nftables mode's tables (both
// families) when it starts in userspace, the userspace mode's service
// addresses when it starts in nftables. A mode that cannot run leaves
// everything alone.
func TestRootProxyModeSwitch(t *testing.T) {
	testutil.RequireRoot(t)
	ns := testutil.NewNetNS(t)
	ctx := context.Background()
	kits := proxyModeKits()
	kits[ProxyModeNFTables] = overNetlink(kits[ProxyModeNFTables])
	pick := func(mode string) string {
		t.Helper()
		var got string
		if err := netns.Do(ns, func() error {
			var err error
			got, err = pickProxyMode(ctx, mode, kits)
			return err
		}); err != nil {
			t.Fatalf("pickProxyMode(%s): %v", mode, err)
		}
		return got
	}
	if got := pick(ProxyModeAuto); got != ProxyModeNFTables {
		t.Errorf("auto picked %s here, want nftables (the kernel has nf_tables)", got)
	}

	testutil.RunIn(t, ns, "nft", "add table ip flatnet-proxy; add chain ip flatnet-proxy services; add table ip6 flatnet-proxy; add table ip other")
	pick(ProxyModeUserspace)
	if out := testutil.RunIn(t, ns, "nft", "list", "tables"); strings.Contains(out, "flatnet-proxy") || !strings.Contains(out, "table ip other") {
		t.Errorf("after starting in userspace mode, tables:\n%s\nwant the nftables mode's gone and the other one kept", out)
	}

	b := userspace.New(userspace.Config{NetNS: ns, NodeName: "n1"})
	t.Cleanup(b.Close)
	svc := &proxy.Service{Namespace: "ns", Name: "web", Type: proxy.ClusterIP, ClusterIP: netip.MustParseAddr("10.246.121.10"),
		Ports: []proxy.ServicePort{{Name: "http", Protocol: proxy.TCP, Port: 80}}}
	if _, err := b.Sync(ctx, []*proxy.Service{svc}, nil, true); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if out := testutil.RunIn(t, ns, "ip", "-o", "addr"); !strings.Contains(out, "10.246.121.10/32") {
		t.Fatalf("the userspace mode did not add its address:\n%s", out)
	}
	pick(ProxyModeIPTables)
	if out := testutil.RunIn(t, ns, "ip", "-o", "addr"); strings.Contains(out, "10.246.121.10") {
		t.Errorf("after starting in iptables mode the userspace mode's address is left:\n%s", out)
	}

	// An iptables-mode leftover: its chains and the jump to them go, a
	// chain of someone else's stays.
	testutil.RunIn(t, ns, "iptables", "-t", "nat", "-N", "FLATNET-SERVICES")
	testutil.RunIn(t, ns, "iptables", "-t", "nat", "-A", "PREROUTING", "-j", "FLATNET-SERVICES")
	testutil.RunIn(t, ns, "iptables", "-t", "nat", "-N", "SOMEONE-ELSE")
	pick(ProxyModeNFTables)
	out := testutil.RunIn(t, ns, "iptables-save", "-t", "nat")
	if strings.Contains(out, "FLATNET-SERVICES") || !strings.Contains(out, "SOMEONE-ELSE") {
		t.Errorf("after starting in nftables mode, nat:\n%s\nwant the iptables mode's chains gone, the other kept", out)
	}
}
