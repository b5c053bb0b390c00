package bridge_test

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/parking"
	"github.com/flatnet/flatnet/internal/cni/veth/vethtest"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// classic is the reference README's bridge config (a unique network and
// bridge name, a free range, the lab's dataDir).
func classic(t testing.TB, subnet string) (conf, brName string) {
	testutil.RequireFreeRange(t, subnet)
	brName = testutil.Name("fnb")
	return fmt.Sprintf(`{
	"cniVersion": "1.0.0",
	"name": %q,
	"type": "bridge",
	"bridge": %q,
	"isGateway": true,
	"ipMasq": true,
	"ipam": {
		"type": "host-local",
		"subnet": %q,
		"dataDir": "@DATADIR@",
		"routes": [
			{ "dst": "0.0.0.0/0" }
		]
	}
}`, testutil.Name("mynet"), brName, subnet), brName
}

func TestAddCheckDel(t *testing.T) {
	conf, brName := classic(t, "10.61.0.0/16")
	l := vethtest.New(t, conf)
	podA, podB := testutil.NewNetNS(t), testutil.NewNetNS(t)
	ra := l.MustAdd("ctr-a", podA)
	rb := l.MustAdd("ctr-b", podB)

	// Result: bridge, host veth, container interface, with MACs.
	if len(ra.Interfaces) != 3 || ra.Interfaces[0].Name != brName || ra.Interfaces[2].Name != "eth0" || ra.Interfaces[2].Sandbox != podA {
		t.Fatalf("interfaces = %+v", ra.Interfaces)
	}
	for _, i := range ra.Interfaces {
		if _, err := net.ParseMAC(i.Mac); err != nil {
			t.Errorf("interface %s has MAC %q", i.Name, i.Mac)
		}
	}
	if len(ra.IPs) != 1 || *ra.IPs[0].Interface != 2 || ra.IPs[0].Gateway.String() != "10.61.0.1" {
		t.Fatalf("IPs = %+v", ra.IPs)
	}
	ipA, ipB := vethtest.IPOf(t, ra, true), vethtest.IPOf(t, rb, true)

	// The kernel agrees with the result.
	host := vethtest.Links(t, l.Host)
	br, ok := host[brName].(*netlink.Bridge)
	if !ok {
		t.Fatalf("no bridge %s in host ns: %v", brName, host)
	}
	if br.HardwareAddr.String() != rb.Interfaces[0].Mac {
		t.Errorf("bridge MAC %s, result says %s", br.HardwareAddr, rb.Interfaces[0].Mac)
	}
	hv := host[ra.Interfaces[1].Name]
	if hv == nil || hv.Attrs().MasterIndex != br.Index || hv.Attrs().HardwareAddr.String() != ra.Interfaces[1].Mac {
		t.Errorf("host veth %s: %+v", ra.Interfaces[1].Name, hv)
	}
	if got := vethtest.Addrs(t, l.Host, brName); !slices.Equal(got, []string{"10.61.0.1/16"}) {
		t.Errorf("bridge addresses = %v", got)
	}
	if got := vethtest.Addrs(t, podA, "eth0"); !slices.Equal(got, []string{ipA.String() + "/16"}) {
		t.Errorf("pod A addresses = %v", got)
	}
	if ct := vethtest.Links(t, podA)["eth0"]; ct.Attrs().HardwareAddr.String() != ra.Interfaces[2].Mac {
		t.Errorf("container MAC %s, result %s", ct.Attrs().HardwareAddr, ra.Interfaces[2].Mac)
	}
	if v := vethtest.Sysctl(t, l.Host, "net/ipv4/ip_forward"); v != "1" {
		t.Errorf("ip_forward = %s in host ns", v)
	}
	rules := vethtest.NFT(t, l.Host)
	for _, ip := range []net.IP{ipA, ipB} {
		if !strings.Contains(rules, fmt.Sprintf("ip saddr %s ip daddr != 10.61.0.0/16 masquerade", ip)) {
			t.Errorf("no masquerade rule for %s:\n%s", ip, rules)
		}
	}

	// Traffic: pod to pod, pod to gateway.
	vethtest.MustExchange(t, podB, vethtest.ServeUDP(t, podA, ipA).Addr)
	vethtest.MustExchange(t, podA, vethtest.ServeUDP(t, l.Host, net.ParseIP("10.61.0.1")).Addr)

	if err := l.Check("ctr-a", podA); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	// CHECK notices a missing address.
	testutil.Run(t, "ip", "-n", testutil.NSName(podB), "addr", "del", ipB.String()+"/16", "dev", "eth0")
	if err := l.Check("ctr-b", podB); vethtest.Code(err) != 106 || !strings.Contains(err.Error(), "lacks address") {
		t.Errorf("CHECK after removing the address: %v", err)
	}

	// DEL, twice.
	for i := 0; i < 2; i++ {
		for _, c := range []struct{ id, ns string }{{"ctr-a", podA}, {"ctr-b", podB}} {
			if err := l.Del(c.id, c.ns); err != nil {
				t.Fatalf("DEL %s (#%d): %v", c.id, i+1, err)
			}
		}
	}
	if v := vethtest.Veths(t, l.Host); len(v) != 0 {
		t.Errorf("veths left in host ns: %v", v)
	}
	if _, ok := vethtest.Links(t, podA)["eth0"]; ok {
		t.Error("eth0 left in pod A")
	}
	if r := l.Reservations(); len(r) != 0 {
		t.Errorf("reservations left: %v", r)
	}
	if rules := vethtest.NFT(t, l.Host); strings.Contains(rules, "10.61.0.0/16 masquerade") {
		t.Errorf("masquerade rules left:\n%s", rules)
	}
}

// The reference's classic bridge config in every result version.
func TestClassicVersions(t *testing.T) {
	for _, v := range []string{"0.3.1", "0.4.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			conf, _ := classic(t, "10.62.0.0/16")
			conf = strings.Replace(conf, `"1.0.0"`, fmt.Sprintf("%q", v), 1)
			l := vethtest.New(t, conf)
			pod := testutil.NewNetNS(t)
			r := l.MustAdd("c", pod)
			if got := vethtest.Addrs(t, pod, "eth0"); len(got) != 1 || !strings.HasPrefix(got[0], "10.62.") {
				t.Errorf("pod addresses = %v (result %+v)", got, r)
			}
			if v != "0.3.1" {
				if err := l.Check("c", pod); err != nil {
					t.Errorf("CHECK: %v", err)
				}
			}
			if err := l.Del("c", pod); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestDelAfterNetnsGone(t *testing.T) {
	conf, _ := classic(t, "10.63.0.0/16")
	l := vethtest.New(t, conf)
	name := testutil.Name("fnt")
	pod, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete(name) })
	r := l.MustAdd("gone", pod)
	ip := vethtest.IPOf(t, r, true)
	if err := netns.Delete(name); err != nil {
		t.Fatal(err)
	}
	if err := l.Del("gone", pod); err != nil {
		t.Fatalf("DEL after the netns is gone: %v", err)
	}
	// The host end is gone at once, not whenever the kernel gets round
	// to destroying the dead namespace.
	if v := vethtest.Veths(t, l.Host); len(v) != 0 {
		t.Errorf("veths left after DEL: %v", v)
	}
	if err := l.Del("gone", pod); err != nil {
		t.Fatalf("second DEL: %v", err)
	}
	if r := l.Reservations(); len(r) != 0 {
		t.Errorf("reservations left: %v", r)
	}
	if rules := vethtest.NFT(t, l.Host); strings.Contains(rules, ip.String()) {
		t.Errorf("rules for %s left:\n%s", ip, rules)
	}
}

// A failed ADD leaves nothing behind: the range has one address, the
// second ADD fails in IPAM (101) after the veth exists.
func TestFailedAddLeavesNothing(t *testing.T) {
	testutil.RequireFreeRange(t, "10.64.0.0/24")
	brName := testutil.Name("fnb")
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"bridge","bridge":%q,"isGateway":true,"ipMasq":true,
		"ipam":{"type":"host-local","dataDir":"@DATADIR@","ranges":[[{"subnet":"10.64.0.0/24","rangeStart":"10.64.0.10","rangeEnd":"10.64.0.10"}]]}}`,
		testutil.Name("fnet"), brName)
	l := vethtest.New(t, conf)
	p1, p2 := testutil.NewNetNS(t), testutil.NewNetNS(t)
	l.MustAdd("one", p1)
	vethsBefore := vethtest.Veths(t, l.Host)
	rulesBefore := vethtest.NFT(t, l.Host)

	_, err := l.Add("two", p2)
	if vethtest.Code(err) != 101 {
		t.Fatalf("ADD into a full range: %v (code %d), want 101", err, vethtest.Code(err))
	}
	if v := vethtest.Veths(t, l.Host); !slices.Equal(v, vethsBefore) {
		t.Errorf("host veths %v after the failed ADD, want %v", v, vethsBefore)
	}
	if _, ok := vethtest.Links(t, p2)["eth0"]; ok {
		t.Error("eth0 left in the failed pod's netns")
	}
	if r := l.Reservations(); !slices.Equal(r, []string{"10.64.0.10"}) {
		t.Errorf("reservations = %v", r)
	}
	if rules := vethtest.NFT(t, l.Host); rules != rulesBefore {
		t.Errorf("ruleset changed by the failed ADD:\nbefore:\n%s\nafter:\n%s", rulesBefore, rules)
	}
	// A full range is no reason to report not ready (docs/cni.md, STATUS).
	if err := l.Status(); err != nil {
		t.Errorf("STATUS with the range exhausted: %v, want ready", err)
	}
	// The existing attachment survived.
	if err := l.Check("one", p1); err != nil {
		t.Errorf("CHECK of the first pod: %v", err)
	}
	if err := l.Del("one", p1); err != nil {
		t.Fatal(err)
	}
	if err := l.Status(); err != nil {
		t.Errorf("STATUS with a free address: %v", err)
	}
}

// An ADD for an interface name that exists fails with 104 and does not
// touch the attachment that owns it.
func TestInterfaceExists(t *testing.T) {
	conf, _ := classic(t, "10.65.0.0/16")
	l := vethtest.New(t, conf)
	pod := testutil.NewNetNS(t)
	l.MustAdd("first", pod)
	_, err := l.Add("second", pod)
	if vethtest.Code(err) != 104 {
		t.Fatalf("second ADD into the same netns/ifname: %v, want code 104", err)
	}
	if r := l.Reservations(); len(r) != 1 {
		t.Errorf("reservations = %v, want the first pod's", r)
	}
	if err := l.Check("first", pod); err != nil {
		t.Errorf("CHECK of the first attachment: %v", err)
	}
	// A missing netns: code 3.
	_, err = l.Add("ghost", "/run/netns/fnt-does-not-exist")
	if vethtest.Code(err) != 3 {
		t.Errorf("ADD into a missing netns: %v, want code 3", err)
	}
	if r := l.Reservations(); len(r) != 1 {
		t.Errorf("reservations after the missing-netns ADD = %v", r)
	}
}

func TestGC(t *testing.T) {
	conf, _ := classic(t, "10.66.0.0/16")
	l := vethtest.New(t, conf)
	p1, p2 := testutil.NewNetNS(t), testutil.NewNetNS(t)
	r1 := l.MustAdd("keep", p1)
	r2 := l.MustAdd("stale", p2)
	if err := l.GC("keep"); err != nil {
		t.Fatal(err)
	}
	if r := l.Reservations(); !slices.Equal(r, []string{vethtest.IPOf(t, r1, true).String()}) {
		t.Errorf("reservations after GC = %v", r)
	}
	rules := vethtest.NFT(t, l.Host)
	if strings.Contains(rules, "saddr "+vethtest.IPOf(t, r2, true).String()+" ") {
		t.Errorf("stale masquerade rule survived GC:\n%s", rules)
	}
	if !strings.Contains(rules, "saddr "+vethtest.IPOf(t, r1, true).String()+" ") {
		t.Errorf("valid masquerade rule removed by GC:\n%s", rules)
	}
	if err := l.Check("keep", p1); err != nil {
		t.Errorf("CHECK after GC: %v", err)
	}
	if err := l.Status(); err != nil {
		t.Errorf("STATUS: %v", err)
	}
}

func TestIPv6(t *testing.T) {
	testutil.RequireFreeRange(t, "10.67.0.0/24", "fd00:67::/64")
	brName := testutil.Name("fnb")
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"bridge","bridge":%q,"isDefaultGateway":true,"ipMasq":true,
		"ipam":{"type":"host-local","dataDir":"@DATADIR@","ranges":[[{"subnet":"10.67.0.0/24"}],[{"subnet":"fd00:67::/64"}]]}}`,
		testutil.Name("fnet"), brName)
	l := vethtest.New(t, conf)
	p1, p2 := testutil.NewNetNS(t), testutil.NewNetNS(t)
	r1 := l.MustAdd("v6a", p1)
	r2 := l.MustAdd("v6b", p2)
	ip6a, ip6b := vethtest.IPOf(t, r1, false), vethtest.IPOf(t, r2, false)
	if got := vethtest.Addrs(t, p1, "eth0"); len(got) != 2 {
		t.Errorf("pod addresses = %v", got)
	}
	if got := vethtest.Addrs(t, l.Host, brName); !slices.Equal(got, []string{"10.67.0.1/24", "fd00:67::1/64"}) {
		t.Errorf("bridge addresses = %v", got)
	}
	if v := vethtest.Sysctl(t, l.Host, "net/ipv6/conf/all/forwarding"); v != "1" {
		t.Errorf("IPv6 forwarding = %s", v)
	}
	vethtest.MustExchange(t, p2, vethtest.ServeUDP(t, p1, ip6a).Addr)
	vethtest.MustExchange(t, p1, vethtest.ServeUDP(t, l.Host, net.ParseIP("fd00:67::1")).Addr)
	if !strings.Contains(vethtest.NFT(t, l.Host), fmt.Sprintf("ip6 saddr %s ip6 daddr != fd00:67::/64 masquerade", ip6b)) {
		t.Errorf("no IPv6 masquerade rule:\n%s", vethtest.NFT(t, l.Host))
	}
	// isDefaultGateway: default routes of both families via the bridge.
	if err := l.Check("v6a", p1); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	routes := testutil.Run(t, "ip", "-n", testutil.NSName(p1), "-6", "route")
	if !strings.Contains(routes, "default via fd00:67::1") {
		t.Errorf("no IPv6 default route:\n%s", routes)
	}
	for _, c := range []struct{ id, ns string }{{"v6a", p1}, {"v6b", p2}} {
		if err := l.Del(c.id, c.ns); err != nil {
			t.Fatal(err)
		}
	}
	if rules := vethtest.NFT(t, l.Host); strings.Contains(rules, "fd00:67::") {
		t.Errorf("IPv6 rules left:\n%s", rules)
	}
}

// Traffic from a pod to an address outside the pod subnet leaves the node
// with the node's address, with either masquerade backend.
func TestMasquerade(t *testing.T) {
	for _, backend := range []string{"nftables", "iptables"} {
		t.Run(backend, func(t *testing.T) {
			testutil.RequireFreeRange(t, "10.68.0.0/24", "10.68.250.0/30")
			conf, _ := classic(t, "10.68.0.0/24")
			conf = strings.Replace(conf, `"ipMasq": true,`, fmt.Sprintf(`"ipMasq": true, "ipMasqBackend": %q,`, backend), 1)
			l := vethtest.New(t, conf)
			outside := vethtest.Outside(t, l.Host, "10.68.250.1", "10.68.250.2")
			pod := testutil.NewNetNS(t)
			r := l.MustAdd("masq", pod)
			echo := vethtest.ServeUDP(t, outside, net.ParseIP("10.68.250.2"))
			vethtest.MustExchange(t, pod, echo.Addr)
			if src := echo.LastSource(); src != "10.68.250.1" {
				t.Errorf("outside saw source %q, want the host's 10.68.250.1", src)
			}
			if err := l.Check("masq", pod); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			ip := vethtest.IPOf(t, r, true).String()
			ipt := testutil.RunIn(t, l.Host, "iptables-save", "-t", "nat")
			if got := strings.Contains(ipt, "-s "+ip+"/32"); got != (backend == "iptables") {
				t.Errorf("iptables rule for %s present: %v, backend %s:\n%s", ip, got, backend, ipt)
			}
			if err := l.Del("masq", pod); err != nil {
				t.Fatal(err)
			}
			if ipt := testutil.RunIn(t, l.Host, "iptables-save", "-t", "nat"); strings.Contains(ipt, "FNMQ-") {
				t.Errorf("iptables rules left:\n%s", ipt)
			}
			if rules := vethtest.NFT(t, l.Host); strings.Contains(rules, "saddr "+ip) {
				t.Errorf("nftables rules left:\n%s", rules)
			}
		})
	}
}

func TestVLAN(t *testing.T) {
	testutil.RequireFreeRange(t, "10.69.0.0/24")
	brName := testutil.Name("fnb")
	mk := func(vlan int) string {
		return fmt.Sprintf(`{"cniVersion":"1.1.0","name":"vlan%d","type":"bridge","bridge":%q,"vlan":%d,
			"ipam":{"type":"host-local","dataDir":"@DATADIR@","ranges":[[{"subnet":"10.69.0.0/24","rangeStart":"10.69.0.%d","rangeEnd":"10.69.0.%d"}]]}}`,
			vlan, brName, vlan, vlan, vlan+50)
	}
	l100 := vethtest.New(t, mk(100))
	l200 := l100.WithConf(mk(200))
	a, b, c := testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
	ra, err := l100.Add("a", a)
	if !vlanFiltering(t) {
		// The plugin must say so (105) and leave nothing behind: that is
		// the whole contract on such a kernel (CI's has no VLAN
		// filtering), so this passes rather than skips.
		if vethtest.Code(err) != 105 || !strings.Contains(err.Error(), "VLAN filtering") {
			t.Errorf("ADD with vlan on a kernel without VLAN filtering: %v, want code 105", err)
		}
		if v := vethtest.Veths(t, l100.Host); len(v) != 0 || len(l100.Reservations()) != 0 {
			t.Errorf("left behind: veths %v, reservations %v", v, l100.Reservations())
		}
		t.Log("this kernel has no bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING): checked the refusal; VLAN traffic is checked where the kernel has it")
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	l100.MustAdd("b", b)
	rc := l200.MustAdd("c", c)

	br := vethtest.Links(t, l100.Host)[brName].(*netlink.Bridge)
	if br.VlanFiltering == nil || !*br.VlanFiltering {
		t.Errorf("bridge %s has no VLAN filtering", brName)
	}
	out := testutil.Run(t, "bridge", "-n", testutil.NSName(l100.Host), "vlan", "show", "dev", ra.Interfaces[1].Name)
	if !strings.Contains(out, "100 PVID Egress Untagged") || strings.Contains(out, " 1 PVID") {
		t.Errorf("port VLANs of %s:\n%s", ra.Interfaces[1].Name, out)
	}
	// Same VLAN talks; across VLANs does not.
	ipA := vethtest.IPOf(t, ra, true)
	echo := vethtest.ServeUDP(t, a, ipA)
	vethtest.MustExchange(t, b, echo.Addr)
	if err := vethtest.Exchange(c, echo.Addr); err == nil {
		t.Errorf("pod in VLAN 200 (%s) reached pod in VLAN 100", vethtest.IPOf(t, rc, true))
	}
	for _, x := range []struct {
		l      *vethtest.Lab
		id, ns string
	}{{l100, "a", a}, {l100, "b", b}, {l200, "c", c}} {
		if err := x.l.Del(x.id, x.ns); err != nil {
			t.Fatal(err)
		}
	}
}

// vlanFiltering reports whether the kernel can make a VLAN-filtering
// bridge (tried in a scratch namespace).
func vlanFiltering(t *testing.T) bool {
	ns := testutil.NewNetNS(t)
	err := exec.Command("ip", "-n", testutil.NSName(ns), "link", "add", "brv", "type", "bridge", "vlan_filtering", "1").Run()
	return err == nil
}

func TestHairpinAndSpoofcheck(t *testing.T) {
	testutil.RequireFreeRange(t, "10.60.0.0/24")
	brName := testutil.Name("fnb")
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"bridge","bridge":%q,"isGateway":true,"hairpinMode":true,"macspoofchk":true,
		"ipam":{"type":"host-local","dataDir":"@DATADIR@","ranges":[[{"subnet":"10.60.0.0/24"}]]}}`, testutil.Name("fnet"), brName)
	l := vethtest.New(t, conf)
	p1, p2 := testutil.NewNetNS(t), testutil.NewNetNS(t)
	r1 := l.MustAdd("h1", p1)
	r2 := l.MustAdd("h2", p2)
	err := l.InHost(func() error {
		link, err := netlinkx.LinkByName(r1.Interfaces[1].Name)
		if err != nil {
			return err
		}
		pi, err := netlink.LinkGetProtinfo(link)
		if err != nil {
			return err
		}
		if !pi.Hairpin {
			t.Errorf("port %s has no hairpin flag", link.Attrs().Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rules := vethtest.NFT(t, l.Host)
	if !strings.Contains(rules, "ether saddr "+r1.Interfaces[2].Mac+" return") || !strings.Contains(rules, `"`+r1.Interfaces[1].Name+`" : goto`) {
		t.Errorf("no spoof-check rules for %s:\n%s", r1.Interfaces[1].Name, rules)
	}
	// Legitimate traffic passes; after changing the pod's MAC, it does not.
	echo := vethtest.ServeUDP(t, p2, vethtest.IPOf(t, r2, true))
	vethtest.MustExchange(t, p1, echo.Addr)
	if err := l.Check("h1", p1); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	testutil.Run(t, "ip", "-n", testutil.NSName(p1), "link", "set", "eth0", "address", "02:11:22:33:44:55")
	testutil.Run(t, "ip", "-n", testutil.NSName(p1), "neigh", "flush", "all")
	testutil.Run(t, "ip", "-n", testutil.NSName(p2), "neigh", "flush", "all")
	if err := vethtest.Exchange(p1, echo.Addr); err == nil {
		t.Error("spoofed MAC got through")
	}
	for _, c := range []struct{ id, ns string }{{"h1", p1}, {"h2", p2}} {
		if err := l.Del(c.id, c.ns); err != nil {
			t.Fatal(err)
		}
	}
	if rules := vethtest.NFT(t, l.Host); strings.Contains(rules, "ether saddr") {
		t.Errorf("spoof-check rules left:\n%s", rules)
	}
}

func TestConcurrentAdds(t *testing.T) {
	conf, _ := classic(t, "10.59.0.0/16")
	l := vethtest.New(t, conf)
	const n = 12
	pods := make([]string, n)
	for i := range pods {
		pods[i] = testutil.NewNetNS(t)
	}
	ips := make([]string, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range pods {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := l.Add(fmt.Sprintf("c%d", i), pods[i])
			if err == nil {
				ips[i] = r.IPs[0].Address.IP.String()
			}
			errs[i] = err
		}(i)
	}
	wg.Wait()
	seen := map[string]bool{}
	rules := vethtest.NFT(t, l.Host)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ADD c%d: %v", i, err)
		}
		if seen[ips[i]] {
			t.Errorf("IP %s handed out twice", ips[i])
		}
		seen[ips[i]] = true
		if !strings.Contains(rules, "ip saddr "+ips[i]+" ") {
			t.Errorf("no masquerade rule for %s", ips[i])
		}
	}
	for i := range pods {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = l.Del(fmt.Sprintf("c%d", i), pods[i])
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("DEL c%d: %v", i, err)
		}
	}
	if v := vethtest.Veths(t, l.Host); len(v) != 0 {
		t.Errorf("veths left: %v", v)
	}
	if rules := vethtest.NFT(t, l.Host); strings.Contains(rules, "masquerade comment") {
		t.Errorf("rules left:\n%s", rules)
	}
}

// BenchmarkAddDel times one pod's ADD and DEL through libcni with the
// classic config (bridge + in-process host-local, isGateway, ipMasq).
func BenchmarkAddDel(b *testing.B) {
	conf, _ := classic(b, "10.58.0.0/16")
	l := vethtest.New(b, conf)
	pod := testutil.NewNetNS(b)
	l.MustAdd("warm", pod)
	if err := l.Del("warm", pod); err != nil {
		b.Fatal(err)
	}
	var add, del time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("b%d", i)
		t0 := time.Now()
		l.MustAdd(id, pod)
		t1 := time.Now()
		if err := l.Del(id, pod); err != nil {
			b.Fatal(err)
		}
		add += t1.Sub(t0)
		del += time.Since(t1)
	}
	b.ReportMetric(float64(add.Microseconds())/float64(b.N)/1000, "ms/ADD")
	b.ReportMetric(float64(del.Microseconds())/float64(b.N)/1000, "ms/DEL")
}

// Layer 2 only (no ipam): the container end is up with no address, MTU
// applies to the bridge and both ends; disableContainerInterface leaves
// the container end down.
func TestLayer2AndMTU(t *testing.T) {
	brName := testutil.Name("fnb")
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"bridge","bridge":%q,"mtu":1450,"promiscMode":true,"portIsolation":true}`, testutil.Name("fnet"), brName)
	l := vethtest.New(t, conf)
	pod, down := testutil.NewNetNS(t), testutil.NewNetNS(t)
	r := l.MustAdd("l2", pod)
	if len(r.IPs) != 0 || len(r.Interfaces) != 3 {
		t.Errorf("L2 result = %+v", r)
	}
	c := vethtest.Links(t, pod)["eth0"]
	if c == nil || c.Attrs().MTU != 1450 || c.Attrs().Flags&net.FlagUp == 0 || c.Attrs().HardwareAddr.String() != r.Interfaces[2].Mac {
		t.Fatalf("container end = %+v", c)
	}
	host := vethtest.Links(t, l.Host)
	if br := host[brName]; br.Attrs().MTU != 1450 || br.Attrs().Promisc == 0 {
		t.Errorf("bridge = %+v", br.Attrs())
	}
	if hv := host[r.Interfaces[1].Name]; hv.Attrs().MTU != 1450 {
		t.Errorf("host end MTU = %d", hv.Attrs().MTU)
	}
	if err := l.InHost(func() error {
		pi, err := netlink.LinkGetProtinfo(host[r.Interfaces[1].Name])
		if err == nil && !pi.Isolated {
			t.Errorf("portIsolation: port %s is not isolated", r.Interfaces[1].Name)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.Check("l2", pod); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := l.Status(); err != nil {
		t.Errorf("STATUS without IPAM: %v", err)
	}
	if err := l.Del("l2", pod); err != nil {
		t.Fatal(err)
	}

	l2 := l.WithConf(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"bridge","bridge":%q,"disableContainerInterface":true}`, testutil.Name("fnet"), brName))
	l2.MustAdd("down", down)
	if c := vethtest.Links(t, down)["eth0"]; c == nil || c.Attrs().Flags&net.FlagUp != 0 {
		t.Errorf("disableContainerInterface: container end = %+v", c)
	}
	if err := l2.Del("down", down); err != nil {
		t.Fatal(err)
	}
	if v := vethtest.Veths(t, l.Host); len(v) != 0 {
		t.Errorf("veths left: %v", v)
	}
}

// enabledad: ADD returns once duplicate address detection is over, so the
// pod's IPv6 address is usable (not tentative) when the runtime gets the
// result.
func TestEnableDAD(t *testing.T) {
	testutil.RequireFreeRange(t, "fd00:57::/64")
	brName := testutil.Name("fnb")
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"bridge","bridge":%q,"isGateway":true,"enabledad":true,
		"ipam":{"type":"host-local","dataDir":"@DATADIR@","ranges":[[{"subnet":"fd00:57::/64"}]]}}`, testutil.Name("fnet"), brName)
	l := vethtest.New(t, conf)
	pod := testutil.NewNetNS(t)
	r := l.MustAdd("dad", pod)
	if v := vethtest.Sysctl(t, pod, "net/ipv6/conf/eth0/accept_dad"); v != "1" {
		t.Errorf("accept_dad = %s", v)
	}
	out := testutil.Run(t, "ip", "-n", testutil.NSName(pod), "-6", "addr", "show", "dev", "eth0")
	if !strings.Contains(out, vethtest.IPOf(t, r, false).String()) || strings.Contains(out, "tentative") {
		t.Errorf("pod address not settled:\n%s", out)
	}
	if err := l.Del("dad", pod); err != nil {
		t.Fatal(err)
	}
}

// DEL parks the veth instead of waiting for its removal: when DEL returns
// the address answers nowhere and is reused at once, the interface name is
// free in the container, and the parked links are collected by the next
// ADD once stale (no agent) or by GC.
func TestDelParks(t *testing.T) {
	testutil.RequireFreeRange(t, "10.62.0.0/24")
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"bridge","bridge":%q,"isGateway":true,
	 "ipam":{"type":"host-local","dataDir":"@DATADIR@","ranges":[[{"subnet":"10.62.0.0/24","rangeStart":"10.62.0.10","rangeEnd":"10.62.0.10"}]]}}`,
		testutil.Name("park"), testutil.Name("fnb"))
	l := vethtest.New(t, conf)
	podA, podB, podC := testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
	ip := net.ParseIP("10.62.0.10")
	if got := vethtest.IPOf(t, l.MustAdd("ctr-a", podA), true); !got.Equal(ip) {
		t.Fatalf("pod A got %s, want %s", got, ip)
	}
	echoA := vethtest.ServeUDP(t, podA, ip)
	vethtest.MustExchange(t, l.Host, echoA.Addr)
	if err := l.Del("ctr-a", podA); err != nil {
		t.Fatal(err)
	}
	links := vethtest.Links(t, podA)
	if _, ok := links["eth0"]; ok {
		t.Error("eth0 still in pod A's netns after DEL: its name must be free")
	}
	parkedA := vethtest.Parked(t, podA)
	if len(parkedA) != 1 || !strings.HasPrefix(parkedA[0], "fnpk") {
		t.Errorf("pod A's netns: parked %v, want its old eth0 as fnpk*", parkedA)
	}
	if p := vethtest.Parked(t, l.Host); len(p) != 1 {
		t.Errorf("host: parked %v, want pod A's host end", p)
	}
	if v := vethtest.Veths(t, l.Host); len(v) != 0 {
		t.Errorf("host: veths up after DEL: %v", v)
	}
	var marker string
	if err := l.InHost(func() (err error) { marker, err = parking.MarkerPath(); return err }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("no marker after parking: %v", err)
	}

	// The only address of the range goes to pod B at once, and only B
	// answers on it.
	if got := vethtest.IPOf(t, l.MustAdd("ctr-b", podB), true); !got.Equal(ip) {
		t.Fatalf("pod B got %s, want %s (freed by A's DEL)", got, ip)
	}
	echoB := vethtest.ServeUDP(t, podB, ip)
	vethtest.MustExchange(t, l.Host, echoB.Addr)
	if err := vethtest.Exchange(l.Host, echoA.Addr); err == nil {
		t.Error("pod A's parked interface still answers")
	}
	if p := vethtest.Parked(t, l.Host); len(p) != 1 {
		t.Errorf("a fresh marker: ADD collected (parked now %v)", p)
	}

	// No collector ran: an ADD after StaleAfter collects, beside its work.
	if err := l.Del("ctr-b", podB); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-parking.StaleAfter - time.Second)
	if err := os.Chtimes(marker, old, old); err != nil {
		t.Fatal(err)
	}
	l.MustAdd("ctr-c", podC)
	if p := vethtest.Parked(t, l.Host); len(p) != 0 {
		t.Errorf("ADD with a stale marker left parked links %v", p)
	}
	if links := vethtest.Links(t, podA); len(links) != 1 {
		t.Errorf("pod A's netns after collection: %v, want lo only", slices.Collect(maps.Keys(links)))
	}
	if err := l.Del("ctr-c", podC); err != nil {
		t.Fatal(err)
	}
	if err := l.GC(); err != nil {
		t.Fatal(err)
	}
	if p := vethtest.Parked(t, l.Host); len(p) != 0 {
		t.Errorf("GC left parked links %v", p)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("marker after GC: %v", err)
	}
}
