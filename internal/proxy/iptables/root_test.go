package iptables

import (
	"context"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/testutil"
)

// requireIPTables skips t unless it runs as root with both families'
// iptables binaries installed.
func requireIPTables(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
	for _, p := range []ipt.Protocol{ipt.IPv4, ipt.IPv6} {
		if err := ipt.Available(p); err != nil {
			testutil.Skip(t, "%v (hack/deps.sh installs iptables)", err)
		}
	}
}

var counters = regexp.MustCompile(`(?m)^#.*\n|\[\d+:\d+\]`)

// save is iptables-save of both tables in ns, without dates and counters.
func save(t *testing.T, ns string, fam ipt.Protocol) string {
	t.Helper()
	out := ""
	for _, table := range []string{"nat", "filter"} {
		out += testutil.RunIn(t, ns, fam.String()+"-save", "-t", table)
	}
	return counters.ReplaceAllString(out, "")
}

func mustRead(t *testing.T, i ipt.Interface, fam ipt.Protocol) *Existing {
	t.Helper()
	e, err := read(context.Background(), i, fam)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// every feature at once, for the kernel to accept or refuse.
func everyFeature(v6 bool) []*proxy.Service {
	p := func(s string) string {
		if v6 {
			return "fd00::" + strings.ReplaceAll(s, ".", ":")
		}
		return "10." + s
	}
	e := func(addr, nodeName string) proxy.Endpoint { return ep(p(addr), 8080, nodeName) }
	web := nodePort(svc("web", p("96.0.10"), 80, e("244.1.5", node), e("244.2.5", "node-b")), 30080)
	web.ExternalIPs = []netip.Addr{a(p("29.0.7"))}
	sticky := svc("sticky", p("96.0.11"), 80, e("244.2.6", "node-b"), e("244.3.6", "node-c"))
	sticky.AffinityTimeout = time.Hour
	lb := nodePort(svc("lb", p("96.0.12"), 443, e("244.1.7", node)), 30443)
	lb.Type, lb.LoadBalancerIPs, lb.ExternalLocal = proxy.LoadBalancer, []netip.Addr{a(p("29.1.9"))}, true
	lb.Firewall, lb.SourceRanges = true, []netip.Prefix{netip.MustParsePrefix("172.31.0.0/16"), netip.MustParsePrefix("fd31::/16")}
	empty := nodePort(svc("empty", p("96.0.13"), 80), 30013)
	itp := svc("itp", p("96.0.14"), 80, e("244.2.8", "node-b"))
	itp.InternalLocal = true
	return []*proxy.Service{web, sticky, lb, empty, itp}
}

// TestRootRestoreAccepted: the kernel's iptables accepts every rule the
// renderer writes, in both families, through full and partial syncs; two
// full syncs leave the same iptables-save; Cleanup removes everything of
// ours and leaves other writers' chains and nftables tables alone.
func TestRootRestoreAccepted(t *testing.T) {
	requireIPTables(t)
	ctx := context.Background()
	ns := testutil.NewNetNS(t)
	real := ipt.InNetNS{Path: ns, Runner: ipt.New()}
	nftTable := testutil.Name("fntkeep")
	testutil.RunIn(t, ns, "nft", "add", "table", "ip", nftTable)
	testutil.RunIn(t, ns, "nft", "add", "chain", "ip", nftTable, "services")
	nftBefore := testutil.RunIn(t, ns, "nft", "list", "table", "ip", nftTable)
	testutil.RunIn(t, ns, "iptables", "-t", "nat", "-N", "FLATNET-HOSTPORT-DNAT")
	testutil.RunIn(t, ns, "iptables", "-t", "nat", "-A", "PREROUTING", "-j", "FLATNET-HOSTPORT-DNAT")
	empty := save(t, ns, ipt.IPv4) + save(t, ns, ipt.IPv6)

	for _, fam := range []ipt.Protocol{ipt.IPv4, ipt.IPv6} {
		cfg := Config{Family: fam, NodeName: node, ClusterCIDRs: []netip.Prefix{clusterCIDR, netip.MustParsePrefix("fd00:244::/48")}}
		services := everyFeature(fam == ipt.IPv6)
		b := NewBackend(real, cfg)
		if _, err := b.Sync(ctx, services, nil, true); err != nil {
			t.Fatalf("%s full sync: %v", fam, err)
		}
		first := save(t, ns, fam)
		if !strings.Contains(first, "--rcheck") || !strings.Contains(first, "FLATNET-FW-") || !strings.Contains(first, "statistic") {
			t.Fatalf("%s: rules missing:\n%s", fam, first)
		}
		// Rules are written as iptables-save prints them: a second full
		// sync finds every chain as it wants it and restores nothing.
		if res, err := NewBackend(real, cfg).Sync(ctx, services, nil, true); err != nil {
			t.Fatalf("%s second full sync: %v", fam, err)
		} else if res.Operations != 0 {
			_, in := New(cfg).Full(services, mustRead(t, real, fam))
			t.Errorf("%s: a second full sync wrote %d lines:\n%s", fam, res.Operations, in)
		}
		if again := save(t, ns, fam); again != first {
			t.Errorf("%s: a second full sync changed the tables:\n%s\nthen:\n%s", fam, first, again)
		}
		// Partial syncs: endpoints come and go, a service is deleted.
		web := *services[0]
		web.Ports = []proxy.ServicePort{web.Ports[0]}
		web.Ports[0].Endpoints = nil
		changed := []*proxy.Service{&web, services[1], services[2], services[3]}
		if _, err := b.Sync(ctx, changed, proxy.ChangesOf(changed, map[string]bool{"ns/web": true, "ns/itp": true}), false); err != nil {
			t.Fatalf("%s partial sync: %v", fam, err)
		}
		if _, err := b.Sync(ctx, services, proxy.ChangesOf(services, map[string]bool{"ns/web": true, "ns/itp": true}), false); err != nil {
			t.Fatalf("%s partial sync back: %v", fam, err)
		}
		res, err := NewBackend(real, cfg).Sync(ctx, services, nil, true)
		if err != nil {
			t.Fatalf("%s full sync after the partial ones: %v", fam, err)
		}
		// Partial syncs inserted dispatch rules first: only those chains
		// are rewritten.
		t.Logf("%s: full sync after partial ones: %d lines", fam, res.Operations)
	}

	for i := 0; i < 2; i++ {
		if err := Cleanup(ctx, real); err != nil {
			t.Fatalf("cleanup %d: %v", i, err)
		}
		if got := save(t, ns, ipt.IPv4) + save(t, ns, ipt.IPv6); got != empty {
			t.Fatalf("cleanup %d left:\n%s\nwant:\n%s", i, got, empty)
		}
	}
	if got := testutil.RunIn(t, ns, "nft", "list", "table", "ip", nftTable); got != nftBefore {
		t.Errorf("cleanup changed the nftables table:\n%s\nwas:\n%s", got, nftBefore)
	}
}

// BenchmarkRootSync measures syncs against the kernel's iptables in a
// test namespace with 10,000 services installed (one full sync first,
// logged): each iteration is a partial sync moving one service's
// endpoint, the restore's cost with a large table in place.
//
//	go test -run XXX -bench RootSync -benchtime 50x ./internal/proxy/iptables/
func BenchmarkRootSync(b *testing.B) {
	testutil.RequireRoot(b)
	if err := ipt.Available(ipt.IPv4); err != nil {
		testutil.Skip(b, "%v (hack/deps.sh installs iptables)", err)
	}
	ctx := context.Background()
	ns := testutil.NewNetNS(b)
	be := NewBackend(ipt.InNetNS{Path: ns, Runner: &ipt.Runner{Timeout: 5 * time.Minute}}, testConfig())
	services := manyServices(10000)
	start := time.Now()
	res, err := be.Sync(ctx, services, nil, true)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("full sync of %d services: %d lines in %v", len(services), res.Operations, time.Since(start))
	start = time.Now()
	if res, err = be.Sync(ctx, services, nil, true); err != nil {
		b.Fatal(err)
	}
	b.Logf("second full sync (iptables-save first): %d lines in %v", res.Operations, time.Since(start))
	lines := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := *services[42]
		s.Ports = slices.Clone(s.Ports)
		s.Ports[0].Endpoints = slices.Clone(s.Ports[0].Endpoints)
		s.Ports[0].Endpoints[0].IP = netip.AddrFrom4([4]byte{10, 247, byte(i >> 8), byte(i)})
		next := slices.Clone(services)
		next[42] = &s
		res, err := be.Sync(ctx, next, proxy.Changes{"ns/svc-42": &s}, false)
		if err != nil {
			b.Fatal(err)
		}
		lines += res.Operations
	}
	b.ReportMetric(float64(lines)/float64(b.N), "lines/op")
}
