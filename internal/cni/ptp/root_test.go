package ptp_test

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/cni/veth/vethtest"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func conf(t *testing.T, ranges string, masq bool) string {
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"ptp","ipMasq":%v,"mtu":1400,
		"ipam":{"type":"host-local","dataDir":"@DATADIR@","ranges":%s,"routes":[{"dst":"0.0.0.0/0"}]}}`,
		testutil.Name("fnet"), masq, ranges)
}

func TestAddCheckDel(t *testing.T) {
	testutil.RequireFreeRange(t, "10.71.0.0/24")
	l := vethtest.New(t, conf(t, `[[{"subnet":"10.71.0.0/24"}]]`, true))
	a, b := testutil.NewNetNS(t), testutil.NewNetNS(t)
	ra := l.MustAdd("a", a)
	rb := l.MustAdd("b", b)
	if len(ra.Interfaces) != 2 || ra.Interfaces[1].Name != "eth0" || ra.Interfaces[1].Sandbox != a {
		t.Fatalf("interfaces = %+v", ra.Interfaces)
	}
	if len(ra.IPs) != 1 || *ra.IPs[0].Interface != 1 || ra.IPs[0].Gateway.String() != "10.71.0.1" {
		t.Fatalf("IPs = %+v", ra.IPs)
	}
	ipA, ipB := vethtest.IPOf(t, ra, true), vethtest.IPOf(t, rb, true)
	if got := vethtest.Addrs(t, a, "eth0"); !slices.Equal(got, []string{ipA.String() + "/32"}) {
		t.Errorf("pod addresses = %v", got)
	}
	if mtu := vethtest.Links(t, a)["eth0"].Attrs().MTU; mtu != 1400 {
		t.Errorf("container MTU = %d", mtu)
	}
	hostVeth := ra.Interfaces[0].Name
	hl := vethtest.Links(t, l.Host)[hostVeth]
	if hl == nil || hl.Attrs().MTU != 1400 || hl.Attrs().HardwareAddr.String() != ra.Interfaces[0].Mac {
		t.Fatalf("host veth %s = %+v", hostVeth, hl)
	}
	if got := vethtest.Addrs(t, l.Host, hostVeth); !slices.Equal(got, []string{"10.71.0.1/32"}) {
		t.Errorf("host veth addresses = %v", got)
	}
	routes := testutil.Run(t, "ip", "-n", testutil.NSName(l.Host), "route")
	if !strings.Contains(routes, ipA.String()+" dev "+hostVeth+" scope link") {
		t.Errorf("no host route to %s:\n%s", ipA, routes)
	}
	if v := vethtest.Sysctl(t, l.Host, "net/ipv4/ip_forward"); v != "1" {
		t.Errorf("ip_forward = %s", v)
	}
	if rules := vethtest.NFT(t, l.Host); !strings.Contains(rules, fmt.Sprintf("ip saddr %s ip daddr != 10.71.0.0/24 masquerade", ipA)) {
		t.Errorf("no masquerade rule for %s:\n%s", ipA, rules)
	}
	// Pod to pod (routed by the host), pod to its gateway.
	vethtest.MustExchange(t, b, vethtest.ServeUDP(t, a, ipA).Addr)
	vethtest.MustExchange(t, a, vethtest.ServeUDP(t, l.Host, net.ParseIP("10.71.0.1")).Addr)

	if err := l.Check("a", a); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	testutil.Run(t, "ip", "-n", testutil.NSName(l.Host), "route", "del", ipB.String())
	if err := l.Check("b", b); vethtest.Code(err) != 106 || !strings.Contains(err.Error(), "no route to "+ipB.String()) {
		t.Errorf("CHECK without the host route: %v", err)
	}
	for i := 0; i < 2; i++ {
		for _, c := range []struct{ id, ns string }{{"a", a}, {"b", b}} {
			if err := l.Del(c.id, c.ns); err != nil {
				t.Fatalf("DEL %s #%d: %v", c.id, i+1, err)
			}
		}
	}
	if v := vethtest.Veths(t, l.Host); len(v) != 0 {
		t.Errorf("veths left: %v", v)
	}
	if r := l.Reservations(); len(r) != 0 {
		t.Errorf("reservations left: %v", r)
	}
	if rules := vethtest.NFT(t, l.Host); strings.Contains(rules, "10.71.0.0/24 masquerade") {
		t.Errorf("rules left:\n%s", rules)
	}
	if routes := testutil.Run(t, "ip", "-n", testutil.NSName(l.Host), "route"); strings.Contains(routes, "10.71.") {
		t.Errorf("routes left:\n%s", routes)
	}
}

func TestIPv6AndMasquerade(t *testing.T) {
	testutil.RequireFreeRange(t, "10.72.0.0/24", "fd00:72::/64", "10.72.250.0/30")
	l := vethtest.New(t, conf(t, `[[{"subnet":"10.72.0.0/24"}],[{"subnet":"fd00:72::/64"}]]`, true))
	outside := vethtest.Outside(t, l.Host, "10.72.250.1", "10.72.250.2")
	a, b := testutil.NewNetNS(t), testutil.NewNetNS(t)
	ra := l.MustAdd("a", a)
	l.MustAdd("b", b)
	if got := vethtest.Addrs(t, a, "eth0"); len(got) != 2 || !strings.HasSuffix(got[1], "/128") {
		t.Errorf("pod addresses = %v", got)
	}
	if v := vethtest.Sysctl(t, l.Host, "net/ipv6/conf/all/forwarding"); v != "1" {
		t.Errorf("IPv6 forwarding = %s", v)
	}
	vethtest.MustExchange(t, b, vethtest.ServeUDP(t, a, vethtest.IPOf(t, ra, false)).Addr)
	vethtest.MustExchange(t, a, vethtest.ServeUDP(t, l.Host, net.ParseIP("fd00:72::1")).Addr)
	echo := vethtest.ServeUDP(t, outside, net.ParseIP("10.72.250.2"))
	vethtest.MustExchange(t, a, echo.Addr)
	if src := echo.LastSource(); src != "10.72.250.1" {
		t.Errorf("outside saw source %q, want 10.72.250.1", src)
	}
	if err := l.Check("a", a); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	for _, c := range []struct{ id, ns string }{{"a", a}, {"b", b}} {
		if err := l.Del(c.id, c.ns); err != nil {
			t.Fatal(err)
		}
	}
	if rules := vethtest.NFT(t, l.Host); strings.Contains(rules, "fd00:72::") || strings.Contains(rules, "10.72.0.") {
		t.Errorf("rules left:\n%s", rules)
	}
}

func TestFailedAddLeavesNothing(t *testing.T) {
	testutil.RequireFreeRange(t, "10.73.0.0/24")
	l := vethtest.New(t, conf(t, `[[{"subnet":"10.73.0.0/24","rangeStart":"10.73.0.10","rangeEnd":"10.73.0.10"}]]`, true))
	p1, p2 := testutil.NewNetNS(t), testutil.NewNetNS(t)
	l.MustAdd("one", p1)
	before, rules := vethtest.Veths(t, l.Host), vethtest.NFT(t, l.Host)
	if _, err := l.Add("two", p2); vethtest.Code(err) != 101 {
		t.Fatalf("ADD into a full range: %v, want code 101", err)
	}
	if v := vethtest.Veths(t, l.Host); !slices.Equal(v, before) {
		t.Errorf("veths %v, want %v", v, before)
	}
	if _, ok := vethtest.Links(t, p2)["eth0"]; ok {
		t.Error("eth0 left in the failed pod")
	}
	if r := l.Reservations(); !slices.Equal(r, []string{"10.73.0.10"}) {
		t.Errorf("reservations = %v", r)
	}
	if got := vethtest.NFT(t, l.Host); got != rules {
		t.Errorf("ruleset changed:\n%s\nwant:\n%s", got, rules)
	}
	// A full range is no reason to report not ready (docs/cni.md, STATUS).
	if err := l.Status(); err != nil {
		t.Errorf("STATUS with the range exhausted: %v, want ready", err)
	}
	// 104: same netns and ifname again; the owner keeps its address.
	if _, err := l.Add("again", p1); vethtest.Code(err) != 104 {
		t.Errorf("ADD over an existing eth0: %v, want 104", err)
	}
	if err := l.Check("one", p1); err != nil {
		t.Errorf("CHECK of the first pod: %v", err)
	}
	if _, err := l.Add("ghost", "/run/netns/fnt-does-not-exist"); vethtest.Code(err) != 3 {
		t.Errorf("ADD into a missing netns: %v, want 3", err)
	}
}

func TestGCAndDelAfterNetnsGone(t *testing.T) {
	testutil.RequireFreeRange(t, "10.74.0.0/24")
	l := vethtest.New(t, conf(t, `[[{"subnet":"10.74.0.0/24"}]]`, true))
	keep, stale := testutil.NewNetNS(t), testutil.NewNetNS(t)
	rk := l.MustAdd("keep", keep)
	rs := l.MustAdd("stale", stale)
	name := testutil.Name("fnt")
	gone, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete(name) })
	rg := l.MustAdd("gone", gone)
	must(t, netns.Delete(name))
	if err := l.Del("gone", gone); err != nil {
		t.Fatalf("DEL after the netns is gone: %v", err)
	}
	if slices.Contains(vethtest.Veths(t, l.Host), rg.Interfaces[0].Name) {
		t.Errorf("host end %s left after DEL", rg.Interfaces[0].Name)
	}
	if rules := vethtest.NFT(t, l.Host); strings.Contains(rules, "saddr "+vethtest.IPOf(t, rg, true).String()+" ") {
		t.Errorf("rule of the deleted pod left:\n%s", rules)
	}
	must(t, l.GC("keep"))
	if r := l.Reservations(); !slices.Equal(r, []string{vethtest.IPOf(t, rk, true).String()}) {
		t.Errorf("reservations after GC = %v", r)
	}
	rules := vethtest.NFT(t, l.Host)
	if strings.Contains(rules, "saddr "+vethtest.IPOf(t, rs, true).String()+" ") || !strings.Contains(rules, "saddr "+vethtest.IPOf(t, rk, true).String()+" ") {
		t.Errorf("after GC:\n%s", rules)
	}
	if err := l.Check("keep", keep); err != nil {
		t.Errorf("CHECK after GC: %v", err)
	}
	if err := l.Status(); err != nil {
		t.Errorf("STATUS: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
