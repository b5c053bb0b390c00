package routes_test

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootNetlinkNexthops: routes go through one nexthop object per
// gateway; a route an older agent wrote plain stays as it is; a route
// whose device has no carrier is written plain (the kernel refuses a
// nexthop there); a nexthop of ours without a route, as a crash leaves
// it, is reused or deleted; and when no route is wanted, none of our
// routes and nexthops is left.
func TestRootNetlinkNexthops(t *testing.T) {
	testutil.RequireFreeRange(t, "10.246.0.0/16", "10.243.0.0/16", "10.245.0.0/16")
	ns := testutil.NewNetNS(t)
	nsn := testutil.NSName(ns)
	ip := func(args ...string) string { return testutil.Run(t, append([]string{"ip", "-n", nsn}, args...)...) }
	ip("link", "add", "nhup0", "type", "veth", "peer", "name", "nhup1")
	ip("link", "add", "nhdown0", "type", "veth", "peer", "name", "nhdown1") // nhdown1 stays down: no carrier
	ip("addr", "add", "10.246.255.254/16", "dev", "nhup0")
	ip("addr", "add", "10.243.255.254/16", "dev", "nhdown0")
	for _, l := range []string{"nhup0", "nhup1", "nhdown0"} {
		ip("link", "set", l, "up")
	}
	ip("route", "add", "10.245.9.0/24", "via", "10.246.0.9", "proto", "0x66")                      // an older agent's
	ip("nexthop", "add", "id", "1711276100", "via", "10.246.0.7", "dev", "nhup0", "proto", "0x66") // reused below
	ip("nexthop", "add", "id", "1711276101", "via", "10.246.0.8", "dev", "nhup0", "proto", "0x66") // left over

	k := &routes.Netlink{}
	sync := func(want ...routes.Route) {
		t.Helper()
		if err := netns.Do(ns, func() error { _, err := routes.Sync(k, want); return err }); err != nil {
			t.Fatal(err)
		}
	}
	r := func(dst, gw string) routes.Route {
		return routes.Route{Dst: netip.MustParsePrefix(dst), Gw: netip.MustParseAddr(gw)}
	}
	sync(r("10.245.9.0/24", "10.246.0.9"), r("10.245.1.0/24", "10.246.0.1"), r("10.245.3.0/24", "10.246.0.1"),
		r("10.245.7.0/24", "10.246.0.7"), r("10.245.2.0/24", "10.243.0.2"))
	got := ip("route", "show", "proto", "0x66")
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^10\.245\.9\.0/24 via 10\.246\.0\.9 dev nhup0`),                 // left plain
		regexp.MustCompile(`(?m)^10\.245\.1\.0/24 nhid (\d+) via 10\.246\.0\.1 dev nhup0`),      // through a nexthop
		regexp.MustCompile(`(?m)^10\.245\.7\.0/24 nhid 1711276100 via 10\.246\.0\.7 dev nhup0`), // the leftover, reused
		regexp.MustCompile(`(?m)^10\.245\.2\.0/24 via 10\.243\.0\.2 dev nhdown0 .*linkdown`),    // no carrier: plain
	} {
		if !want.MatchString(got) {
			t.Errorf("routes lack %s:\n%s", want, got)
		}
	}
	one := regexp.MustCompile(`(?m)^10\.245\.[13]\.0/24 nhid (\d+) `).FindAllStringSubmatch(got, -1)
	if len(one) != 2 || one[0][1] != one[1][1] {
		t.Errorf("two routes through one gateway: %v, want one nexthop", one)
	}
	nhs := ip("nexthop", "show", "proto", "0x66")
	if strings.Contains(nhs, "1711276101") || strings.Count(nhs, "\n") != 2 {
		t.Errorf("nexthops of ours: want the reused one and one for 10.246.0.1, the leftover gone:\n%s", nhs)
	}

	// 10.245.7.0/24 moves to a gateway behind the device without carrier:
	// written plain, and the nexthop it went through (its only route) goes.
	sync(r("10.245.9.0/24", "10.246.0.9"), r("10.245.1.0/24", "10.246.0.1"), r("10.245.3.0/24", "10.246.0.1"),
		r("10.245.7.0/24", "10.243.0.7"), r("10.245.2.0/24", "10.243.0.2"))
	if got := ip("route", "show", "10.245.7.0/24"); !strings.Contains(got, "via 10.243.0.7 dev nhdown0") || strings.Contains(got, "nhid") {
		t.Errorf("10.245.7.0/24 moved behind a device without carrier: %q, want a plain route", got)
	}
	if nhs := ip("nexthop", "show", "proto", "0x66"); strings.Contains(nhs, "1711276100") || strings.Count(nhs, "\n") != 1 {
		t.Errorf("nexthops after the move: want only 10.246.0.1's:\n%s", nhs)
	}

	sync()
	if got, nhs := ip("route", "show", "proto", "0x66"), ip("nexthop", "show", "proto", "0x66"); got != "" || nhs != "" {
		t.Errorf("nothing wanted, left:\nroutes:\n%snexthops:\n%s", got, nhs)
	}
}

// TestRootNetlinkNexthopCompatOff: in a namespace whose route dumps hide
// the gateways of routes through nexthop objects
// (net.ipv4.nexthop_compat_mode 0), the routes are written plain, so that
// List reads what Write wrote: the routes through nexthops already there
// are replaced once, our nexthops go, and the next sync changes nothing.
func TestRootNetlinkNexthopCompatOff(t *testing.T) {
	testutil.RequireFreeRange(t, "10.246.0.0/16", "10.245.0.0/16")
	ns, ip := oneLinkNS(t)

	k := &routes.Netlink{}
	sync := func(want ...routes.Route) routes.Plan {
		t.Helper()
		var p routes.Plan
		if err := netns.Do(ns, func() error { var err error; p, err = routes.Sync(k, want); return err }); err != nil {
			t.Fatal(err)
		}
		return p
	}
	want := []routes.Route{
		{Dst: netip.MustParsePrefix("10.245.1.0/24"), Gw: netip.MustParseAddr("10.246.0.1")},
		{Dst: netip.MustParsePrefix("10.245.2.0/24"), Gw: netip.MustParseAddr("10.246.0.2")},
	}
	sync(want...)
	if got := ip("route", "show", "proto", "0x66"); strings.Count(got, "nhid") != 2 {
		t.Fatalf("with nexthop_compat_mode 1, want both routes through nexthops:\n%s", got)
	}
	testutil.Run(t, "ip", "netns", "exec", testutil.NSName(ns), "sysctl", "-qw", "net.ipv4.nexthop_compat_mode=0")
	if p := sync(want...); len(p.Replace) != 2 || len(p.Delete) != 0 {
		t.Errorf("first sync with nexthop_compat_mode 0: %+v, want both routes replaced", p)
	}
	got := ip("route", "show", "proto", "0x66")
	for _, w := range []string{"10.245.1.0/24 via 10.246.0.1 dev nhup0", "10.245.2.0/24 via 10.246.0.2 dev nhup0"} {
		if !strings.Contains(got, w) {
			t.Errorf("routes lack %q (plain):\n%s", w, got)
		}
	}
	if strings.Contains(got, "nhid") {
		t.Errorf("routes still through nexthops:\n%s", got)
	}
	if nhs := ip("nexthop", "show", "proto", "0x66"); nhs != "" {
		t.Errorf("our nexthops left after the routes went plain:\n%s", nhs)
	}
	for i := range 2 {
		if p := sync(want...); !p.Empty() {
			t.Errorf("sync %d after that: %+v, want no change", i+2, p)
		}
	}
}

// TestRootNetlinkWriteAfterFailure: a write that fails leaves what the
// Netlink knows of the nexthops unsure; the next per-peer Write (no List
// before it, as the agent's peer updates) reads the namespace again and
// still writes through a nexthop object, not plain.
func TestRootNetlinkWriteAfterFailure(t *testing.T) {
	testutil.RequireFreeRange(t, "10.246.0.0/16", "10.245.0.0/16", "10.242.0.0/16")
	ns, ip := oneLinkNS(t)

	k := &routes.Netlink{}
	r := func(dst, gw string) routes.Route {
		return routes.Route{Dst: netip.MustParsePrefix(dst), Gw: netip.MustParseAddr(gw)}
	}
	write := func(cs ...routes.Change) []error {
		t.Helper()
		var errs []error
		if err := netns.Do(ns, func() error { errs = k.Write(cs); return nil }); err != nil {
			t.Fatal(err)
		}
		return errs
	}
	if err := netns.Do(ns, func() error { _, err := routes.Sync(k, []routes.Route{r("10.245.1.0/24", "10.246.0.1")}); return err }); err != nil {
		t.Fatal(err)
	}
	// A gateway on no network of this node: the kernel refuses it.
	if errs := write(routes.Change{Op: routes.Add, Route: r("10.245.9.0/24", "10.242.0.9")}); errs[0] == nil {
		t.Fatalf("a route via an unreachable gateway was accepted")
	}
	if errs := write(routes.Change{Op: routes.Add, Route: r("10.245.2.0/24", "10.246.0.2")}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if got := ip("route", "show", "10.245.2.0/24"); !strings.Contains(got, "nhid") {
		t.Errorf("the write after a failed one: %q, want a route through a nexthop", got)
	}
}

// oneLinkNS is a test namespace with nhup0 up on 10.246.0.0/16 (its veth
// peer up too: carrier), and a function running ip -n in it.
func oneLinkNS(t *testing.T) (string, func(args ...string) string) {
	t.Helper()
	ns := testutil.NewNetNS(t)
	nsn := testutil.NSName(ns)
	ip := func(args ...string) string { return testutil.Run(t, append([]string{"ip", "-n", nsn}, args...)...) }
	ip("link", "add", "nhup0", "type", "veth", "peer", "name", "nhup1")
	ip("addr", "add", "10.246.255.254/16", "dev", "nhup0")
	ip("link", "set", "nhup0", "up")
	ip("link", "set", "nhup1", "up")
	return ns, ip
}
