package ipmasq

import (
	"context"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/nft/nfnl/nfnltest"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// TestRealNFT runs the package against the kernel in a test namespace: the
// same scenarios as the fake tests, so the EEXIST/EBUSY handling and the
// JSON reader meet the real thing.
func TestRealNFT(t *testing.T) {
	ns := testutil.NewNetNS(t)
	if _, err := nft.LookPath(nft.StandardPaths...); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs nftables)", err)
	}
	ctx := context.Background()
	list := func() string {
		return testutil.RunIn(t, ns, "nft", "list", "table", "inet", Table)
	}
	err := netns.Do(ns, func() error {
		m, err := NewDefault()
		if err != nil {
			return err
		}
		must(t, m.Teardown(ctx, attA, nil)) // nothing there yet
		must(t, m.Setup(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
		must(t, m.Setup(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
		must(t, m.Setup(ctx, attC, pfx("10.9.0.5/24")))
		must(t, m.Check(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
		wantCode(t, m.Check(ctx, attB, pfx("10.1.0.6/24")), 106, "is missing")
		got := list()
		for _, want := range []string{
			"ip saddr 10.1.0.5 ip daddr != 10.1.0.0/24 masquerade",
			"ip6 saddr fd00:1::5 ip6 daddr != fd00:1::/64 masquerade",
			"10.1.0.5 : goto " + ChainName(attA),
			"ip daddr 224.0.0.0/4 return",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("ruleset lacks %q:\n%s", want, got)
			}
		}
		// B takes A's IPv4 address: A is evicted, and A's DEL keeps B.
		must(t, m.Setup(ctx, attB, pfx("10.1.0.5/24")))
		must(t, m.Teardown(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
		must(t, m.Check(ctx, attB, pfx("10.1.0.5/24")))
		if got := list(); strings.Contains(got, ChainName(attA)) || strings.Contains(got, "fd00:1::5") {
			t.Errorf("A's rules survived:\n%s", got)
		}
		// GC of mynet with nothing valid: B goes, othernet stays.
		names, err := m.Attachments(ctx, "mynet")
		must(t, err)
		if len(names) != 1 || names[0] != ChainName(attB) {
			t.Errorf("Attachments(mynet) = %v", names)
		}
		must(t, m.GC(ctx, "mynet", nil))
		got = list()
		if strings.Contains(got, ChainName(attB)) || !strings.Contains(got, ChainName(attC)) {
			t.Errorf("after GC:\n%s", got)
		}
		// Teardown with addresses that are not the attachment's.
		must(t, m.Teardown(ctx, attC, pfx("10.9.0.99/24")))
		if got := list(); strings.Contains(got, ChainName(attC)) {
			t.Errorf("C survived its teardown:\n%s", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRootSameAsNFT runs the same operations through the nft binary (the
// text path) in one namespace and over netlink (nfnl, the default) in
// another: `nft list table inet flatnet-cni-masq` must be identical after
// each, so a node switching between old and new plugin binaries finds
// the same table either way.
func TestRootSameAsNFT(t *testing.T) {
	viaExec, viaNL := nfnltest.Sides(t, knftables.InetFamily, Table, func(r *nft.Runner) *Masq {
		r.Classify = Classify
		return New(r)
	}, NewDefault)
	ctx := context.Background()
	nfnltest.Same(t, knftables.InetFamily, Table, viaExec, viaNL, []nfnltest.Step[*Masq]{
		{Name: "setup A", Do: func(m *Masq) error { return m.Setup(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")) }},
		{Name: "setup A again", Do: func(m *Masq) error { return m.Setup(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")) }},
		{Name: "setup C", Do: func(m *Masq) error { return m.Setup(ctx, attC, pfx("10.9.0.5/24")) }},
		{Name: "check A", Do: func(m *Masq) error { return m.Check(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")) }},
		{Name: "B evicts A", Do: func(m *Masq) error { return m.Setup(ctx, attB, pfx("10.1.0.5/24")) }},
		{Name: "teardown A", Do: func(m *Masq) error { return m.Teardown(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")) }},
		{Name: "GC mynet", Do: func(m *Masq) error { return m.GC(ctx, "mynet", nil) }},
		{Name: "teardown C by reading", Do: func(m *Masq) error { return m.Teardown(ctx, attC, nil) }},
	})

	// A node switching binaries: what one path wrote, the other removes.
	list := func(ns string) string { return nfnltest.List(t, ns, knftables.InetFamily, Table) }
	must(t, netns.Do(viaExec.NS, func() error {
		nl, err := NewDefault()
		if err != nil {
			return err
		}
		for _, pair := range [][2]*Masq{{viaExec.V, nl}, {nl, viaExec.V}} {
			must(t, pair[0].Setup(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
			must(t, pair[1].Check(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
			must(t, pair[1].Teardown(ctx, attA, nil))
			if got := list(viaExec.NS); strings.Contains(got, ChainName(attA)) || strings.Contains(got, "10.1.0.5") {
				t.Errorf("A's rules survived a teardown by the other path:\n%s", got)
			}
		}
		return nil
	}))
}

// TestRealIPTables runs the iptables backend against iptables-save and
// iptables-restore in a test namespace: CHECK compares what Setup wrote
// with what iptables-save prints, so the canonical forms must agree.
func TestRealIPTables(t *testing.T) {
	ns := testutil.NewNetNS(t)
	if err := ipt.Available(ipt.IPv4); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs iptables)", err)
	}
	if err := ipt.Available(ipt.IPv6); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs iptables)", err)
	}
	ctx := context.Background()
	save := func() string {
		return testutil.RunIn(t, ns, "iptables-save", "-t", "nat") + testutil.RunIn(t, ns, "ip6tables-save", "-t", "nat")
	}
	err := netns.Do(ns, func() error {
		x := NewIPTables(ipt.New())
		addrs := pfx("10.1.0.5/24", "fd00:1::5/64")
		must(t, x.Setup(ctx, attA, addrs))
		must(t, x.Setup(ctx, attA, addrs))
		must(t, x.Setup(ctx, attB, pfx("10.1.0.6/24")))
		must(t, x.Check(ctx, attA, addrs))
		got := save()
		for _, want := range []string{
			"-A POSTROUTING -s 10.1.0.5/32 -m comment",
			"-s fd00:1::5/128 -d fd00:1::/64 -m comment",
			"-j MASQUERADE",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("nat lacks %q:\n%s", want, got)
			}
		}
		if n := strings.Count(got, "-A POSTROUTING -s 10.1.0.5/32"); n != 1 {
			t.Errorf("%d jump rules for 10.1.0.5 after two Setups:\n%s", n, got)
		}
		must(t, x.Teardown(ctx, attA, nil))
		must(t, x.Teardown(ctx, attA, nil))
		if got := save(); strings.Contains(got, IPTChainName(attA)) || !strings.Contains(got, IPTChainName(attB)) {
			t.Errorf("after Teardown(A):\n%s", got)
		}
		must(t, x.GC(ctx, "mynet", nil))
		if got := save(); strings.Contains(got, "FNMQ-") {
			t.Errorf("after GC:\n%s", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
