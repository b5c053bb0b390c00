package macvlan_test

// Root tests: everything runs in namespaces the test creates. The "host"
// is a lab namespace (vethtest.Lab) holding one end of a veth, the macvlan
// master; the other end is in a "neighbour" namespace standing for another
// machine on the same L2 segment. Pods are namespaces from
// testutil.NewNetNS; the plugins run through libcni from the host
// namespace, with their own cache dir and host-local dataDir.

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/cni/veth/vethtest"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// segment is a master veth in the lab host and its peer ("eth0") in a
// neighbour namespace with nbrAddrs.
type segment struct {
	master string
	nbr    string
}

func newSegment(t *testing.T, host string, nbrAddrs ...string) segment {
	t.Helper()
	s := segment{master: testutil.Name("fnm"), nbr: testutil.NewNetNS(t)}
	testutil.Wire(t, host, s.master, nil, s.nbr, "eth0", nbrAddrs)
	requireMacvlan(t, host, s.master)
	return s
}

// requireMacvlan skips (fails under CI=true) when the kernel cannot make a
// macvlan on master.
func requireMacvlan(t *testing.T, host, master string) {
	t.Helper()
	err := netns.Do(host, func() error {
		m, err := netlinkx.LinkByName(master)
		if err != nil {
			return err
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = testutil.Name("fnk")
		attrs.ParentIndex = m.Attrs().Index
		mv := &netlink.Macvlan{LinkAttrs: attrs, Mode: netlink.MACVLAN_MODE_BRIDGE}
		if err := netlink.LinkAdd(mv); err != nil {
			return err
		}
		return netlink.LinkDel(mv)
	})
	if errors.Is(err, unix.EOPNOTSUPP) {
		testutil.Skip(t, "the kernel has no macvlan support (CONFIG_MACVLAN / modprobe macvlan): %v", err)
	}
	if err != nil {
		t.Fatalf("probing macvlan support: %v", err)
	}
}

func mvConf(master, extra, ipam string) string {
	c := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"macvlan","master":%q%s`, testutil.Name("fnmv"), master, extra)
	if ipam != "" {
		c += `,"ipam":{"type":"host-local","dataDir":"@DATADIR@",` + ipam + `}`
	}
	return c + "}"
}

func link(t *testing.T, ns, name string) netlink.Link {
	t.Helper()
	return vethtest.Links(t, ns)[name]
}

// onlyLo fails t if ns holds any interface but lo (and except).
func onlyLo(t *testing.T, ns string, except ...string) {
	t.Helper()
	for name := range vethtest.Links(t, ns) {
		if name != "lo" && !slices.Contains(except, name) {
			t.Errorf("interface %s left in %s", name, ns)
		}
	}
}

func noMacvlans(t *testing.T, ns string) {
	t.Helper()
	for name, l := range vethtest.Links(t, ns) {
		if l.Type() == "macvlan" {
			t.Errorf("macvlan %s in %s", name, ns)
		}
	}
}

// neighMAC polls ns's ARP table for ip (a gratuitous ARP arrives
// asynchronously) and returns its MAC, or "".
func neighMAC(t *testing.T, ns, ip string) string {
	t.Helper()
	for range 100 { // 10 s: generous on a loaded machine
		var mac string
		err := netns.Do(ns, func() error {
			neighs, err := netlinkx.NeighList(0, netlink.FAMILY_V4)
			for _, n := range neighs {
				if n.IP.String() == ip && n.HardwareAddr != nil {
					mac = n.HardwareAddr.String()
				}
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if mac != "" {
			return mac
		}
		time.Sleep(100 * time.Millisecond)
	}
	return ""
}

func TestRootAddCheckDelTraffic(t *testing.T) {
	testutil.RequireFreeRange(t, "10.76.0.0/24", "10.76.1.0/24", "fd00:76::/64")
	lab := vethtest.New(t, mvConf("x", "", "")) // the real config needs the master's name

	seg := newSegment(t, lab.Host, "10.76.0.1/24", "10.76.1.1/32")
	nbr := testutil.NSName(seg.nbr)
	// Let the neighbour learn addresses from gratuitous ARP alone.
	testutil.Run(t, "ip", "netns", "exec", nbr, "sysctl", "-qw", "net.ipv4.conf.eth0.arp_accept=1")
	lab = lab.WithConf(mvConf(seg.master, `,"mode":"bridge","capabilities":{"mac":true}`,
		`"ranges":[[{"subnet":"10.76.0.0/24","rangeStart":"10.76.0.10","rangeEnd":"10.76.0.60","gateway":"10.76.0.1"}],
		  [{"subnet":"fd00:76::/64","rangeStart":"fd00:76::10","rangeEnd":"fd00:76::60"}]],
		 "routes":[{"dst":"10.76.1.0/24"}]`))

	a, b := testutil.NewNetNS(t), testutil.NewNetNS(t)
	rtA := vethtest.RT("a", a)
	rtA.CapabilityArgs = map[string]any{"mac": "02:76:00:00:00:0a"}
	ra, err := lab.AddRT(rtA)
	if err != nil {
		t.Fatalf("ADD a: %v", err)
	}
	rb := lab.MustAdd("b", b)

	// The result.
	if len(ra.Interfaces) != 1 || ra.Interfaces[0].Name != "eth0" || ra.Interfaces[0].Sandbox != a || ra.Interfaces[0].Mac != "02:76:00:00:00:0a" {
		t.Fatalf("interfaces = %+v", ra.Interfaces)
	}
	if len(ra.IPs) != 2 || *ra.IPs[0].Interface != 0 || ra.IPs[0].Address.String() != "10.76.0.10/24" || ra.IPs[1].Address.String() != "fd00:76::10/64" {
		t.Fatalf("IPs = %+v", ra.IPs)
	}
	// The kernel's view.
	hostM := link(t, lab.Host, seg.master)
	la := link(t, a, "eth0")
	mv, ok := la.(*netlink.Macvlan)
	if !ok {
		t.Fatalf("eth0 in pod a is %T, not a macvlan", la)
	}
	if mv.Mode != netlink.MACVLAN_MODE_BRIDGE || mv.ParentIndex != hostM.Attrs().Index || mv.HardwareAddr.String() != "02:76:00:00:00:0a" ||
		mv.Flags&net.FlagUp == 0 || mv.MTU != hostM.Attrs().MTU {
		t.Errorf("pod a eth0 = mode %d parent %d (master %d) mac %s flags %v mtu %d", mv.Mode, mv.ParentIndex, hostM.Attrs().Index,
			mv.HardwareAddr, mv.Flags, mv.MTU)
	}
	if got := vethtest.Addrs(t, a, "eth0"); !slices.Equal(got, []string{"10.76.0.10/24", "fd00:76::10/64"}) {
		t.Errorf("pod a addresses = %v", got)
	}
	if routes := testutil.Run(t, "ip", "-n", testutil.NSName(a), "route"); !strings.Contains(routes, "10.76.1.0/24 via 10.76.0.1 dev eth0") {
		t.Errorf("pod a routes lack 10.76.1.0/24 via 10.76.0.1:\n%s", routes)
	}
	if v := vethtest.Sysctl(t, a, "net/ipv4/conf/eth0/arp_notify"); v != "1" {
		t.Errorf("arp_notify = %s", v)
	}
	noMacvlans(t, lab.Host)
	// The gratuitous ARP told the neighbour about pod a before any traffic.
	if mac := neighMAC(t, seg.nbr, "10.76.0.10"); mac != "02:76:00:00:00:0a" {
		t.Errorf("neighbour learned %q for 10.76.0.10 from gratuitous ARP, want 02:76:00:00:00:0a", mac)
	}

	// Traffic: pod to pod on the same master, pods to the L2 neighbour,
	// a pod through the IPAM route, the neighbour to a pod.
	ipA, ipB := vethtest.IPOf(t, ra, true), vethtest.IPOf(t, rb, true)
	vethtest.MustExchange(t, a, vethtest.ServeUDP(t, b, ipB).Addr)
	vethtest.MustExchange(t, b, vethtest.ServeUDP(t, a, ipA).Addr)
	vethtest.MustExchange(t, a, vethtest.ServeUDP(t, seg.nbr, net.ParseIP("10.76.0.1")).Addr)
	vethtest.MustExchange(t, b, vethtest.ServeUDP(t, seg.nbr, net.ParseIP("10.76.1.1")).Addr)
	vethtest.MustExchange(t, seg.nbr, vethtest.ServeUDP(t, a, ipA).Addr)

	for _, c := range []struct{ id, ns string }{{"a", a}, {"b", b}} {
		if err := lab.Check(c.id, c.ns); err != nil {
			t.Errorf("CHECK %s: %v", c.id, err)
		}
	}
	testutil.Run(t, "ip", "-n", testutil.NSName(a), "addr", "del", "10.76.0.10/24", "dev", "eth0")
	if err := lab.Check("a", a); vethtest.Code(err) != 106 || !strings.Contains(err.Error(), "10.76.0.10/24") {
		t.Errorf("CHECK without the address: %v, want 106 naming 10.76.0.10/24", err)
	}
	testutil.Run(t, "ip", "-n", testutil.NSName(a), "link", "set", "eth0", "type", "macvlan", "mode", "private")
	testutil.Run(t, "ip", "-n", testutil.NSName(a), "addr", "add", "10.76.0.10/24", "dev", "eth0")
	if err := lab.Check("a", a); vethtest.Code(err) != 106 || !strings.Contains(err.Error(), "mode private") {
		t.Errorf("CHECK with mode changed: %v, want 106 naming the mode", err)
	}
	if got := lab.Reservations(); !slices.Equal(got, []string{"10.76.0.10", "10.76.0.11", "fd00:76::10", "fd00:76::11"}) {
		t.Errorf("reservations = %v", got)
	}

	for i := range 2 {
		if err := lab.Del("a", a); err != nil {
			t.Fatalf("DEL a #%d: %v", i+1, err)
		}
	}
	onlyLo(t, a)
	if got := lab.Reservations(); !slices.Equal(got, []string{"10.76.0.11", "fd00:76::11"}) {
		t.Errorf("reservations after DEL a = %v", got)
	}
	if err := netns.Delete(testutil.NSName(b)); err != nil {
		t.Fatal(err)
	}
	if err := lab.Del("b", b); err != nil {
		t.Fatalf("DEL b after its netns is gone: %v", err)
	}
	if got := lab.Reservations(); len(got) != 0 {
		t.Errorf("reservations after DEL b = %v", got)
	}
	noMacvlans(t, lab.Host)
	if _, ok := vethtest.Links(t, lab.Host)[seg.master]; !ok {
		t.Error("the master disappeared")
	}
}

func TestRootFailuresLeaveNothing(t *testing.T) {
	testutil.RequireFreeRange(t, "10.76.2.0/24")
	lab := vethtest.New(t, mvConf("x", "", ""))
	seg := newSegment(t, lab.Host)
	lab = lab.WithConf(mvConf(seg.master, "", `"ranges":[[{"subnet":"10.76.2.0/24","rangeStart":"10.76.2.10","rangeEnd":"10.76.2.10"}]]`))

	p1, p2, p3 := testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
	lab.MustAdd("p1", p1)
	// A full range is no reason to report not ready (docs/cni.md, STATUS).
	if err := lab.Status(); err != nil {
		t.Errorf("STATUS with the range full: %v, want ready", err)
	}
	// IPAM fails (range exhausted): the link is gone, the error keeps its code.
	_, err := lab.Add("p2", p2)
	if vethtest.Code(err) != 101 {
		t.Fatalf("ADD into a full range: %v, want 101", err)
	}
	onlyLo(t, p2)
	if got := lab.Reservations(); !slices.Equal(got, []string{"10.76.2.10"}) {
		t.Errorf("reservations = %v", got)
	}
	if err := lab.Del("p2", p2); err != nil {
		t.Errorf("DEL after the failed ADD: %v", err)
	}

	// CNI_IFNAME exists: 104, before IPAM is asked (the range is full, so
	// asking would have given 101), and the existing interface stays.
	testutil.Run(t, "ip", "-n", testutil.NSName(p3), "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	_, err = lab.Add("p3", p3)
	if vethtest.Code(err) != 104 || !strings.Contains(err.Error(), "eth0") {
		t.Errorf("ADD with eth0 present: %v, want 104", err)
	}
	onlyLo(t, p3, "eth0", "eth0p")
	if link(t, p3, "eth0").Type() != "veth" {
		t.Error("eth0 in p3 is no longer the veth")
	}

	// Missing master: 7 naming it, nothing created; STATUS 50 naming it.
	missing := lab.WithConf(mvConf("fnnomaster0", "", `"ranges":[[{"subnet":"10.76.2.0/24"}]]`))
	p4 := testutil.NewNetNS(t)
	_, err = missing.Add("p4", p4)
	if vethtest.Code(err) != 7 || !strings.Contains(err.Error(), `"fnnomaster0"`) {
		t.Errorf("ADD with a missing master: %v, want 7 naming fnnomaster0", err)
	}
	onlyLo(t, p4)
	if err := missing.Status(); vethtest.Code(err) != 50 || !strings.Contains(err.Error(), `"fnnomaster0"`) {
		t.Errorf("STATUS with a missing master: %v, want 50 naming fnnomaster0", err)
	}

	// MTU above the master's: 7.
	big := lab.WithConf(mvConf(seg.master, `,"mtu":9000`, `"ranges":[[{"subnet":"10.76.2.0/24"}]]`))
	if _, err := big.Add("p4", p4); vethtest.Code(err) != 7 || !strings.Contains(err.Error(), "MTU") {
		t.Errorf("ADD with mtu 9000: %v, want 7", err)
	}
	onlyLo(t, p4)

	// Missing netns: 3.
	if _, err := lab.Add("p5", "/run/netns/"+testutil.Name("fntgone")); vethtest.Code(err) != 3 {
		t.Errorf("ADD into a missing netns: %v, want 3", err)
	}
	if got := lab.Reservations(); !slices.Equal(got, []string{"10.76.2.10"}) {
		t.Errorf("reservations after the failures = %v", got)
	}
	noMacvlans(t, lab.Host)
}

func TestRootGCAndStatus(t *testing.T) {
	testutil.RequireFreeRange(t, "10.76.3.0/24")
	lab := vethtest.New(t, mvConf("x", "", ""))
	seg := newSegment(t, lab.Host)
	lab = lab.WithConf(mvConf(seg.master, "", `"ranges":[[{"subnet":"10.76.3.0/24","rangeStart":"10.76.3.10","rangeEnd":"10.76.3.20"}]]`))
	a, b := testutil.NewNetNS(t), testutil.NewNetNS(t)
	lab.MustAdd("a", a)
	lab.MustAdd("b", b)
	if err := lab.Status(); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	// A runtime that lost its cache: libcni cannot DEL a, so only the
	// plugin's GC (passed to host-local) can free a's address.
	fresh := *lab
	fresh.CNI = libcni.NewCNIConfigWithCacheDir([]string{testutil.CNIPath(t)}, t.TempDir(), nil)
	if err := fresh.GC("b"); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if got := lab.Reservations(); !slices.Equal(got, []string{"10.76.3.11"}) {
		t.Errorf("reservations after GC keeping b = %v, want only b's 10.76.3.11", got)
	}
	if err := lab.Check("b", b); err != nil {
		t.Errorf("CHECK b after GC: %v", err)
	}
	for _, c := range []struct{ id, ns string }{{"a", a}, {"b", b}} {
		if err := lab.Del(c.id, c.ns); err != nil {
			t.Fatal(err)
		}
	}
	if got := lab.Reservations(); len(got) != 0 {
		t.Errorf("reservations = %v", got)
	}
}

// No master: the default route's interface. No ipam: L2 only.
func TestRootDefaultMasterL2(t *testing.T) {
	lab := vethtest.New(t, mvConf("x", "", ""))
	seg := newSegment(t, lab.Host)
	testutil.Run(t, "ip", "-n", testutil.NSName(lab.Host), "route", "add", "default", "dev", seg.master)
	lab = lab.WithConf(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"macvlan","mode":"vepa","ipam":{}}`, testutil.Name("fnmv")))
	a := testutil.NewNetNS(t)
	r := lab.MustAdd("a", a)
	if len(r.IPs) != 0 || len(r.Interfaces) != 1 {
		t.Errorf("L2 result = %+v", r)
	}
	mv, ok := link(t, a, "eth0").(*netlink.Macvlan)
	if !ok || mv.ParentIndex != link(t, lab.Host, seg.master).Attrs().Index || mv.Mode != netlink.MACVLAN_MODE_VEPA || mv.Flags&net.FlagUp == 0 {
		t.Fatalf("eth0 = %+v, want an up vepa macvlan on %s", link(t, a, "eth0"), seg.master)
	}
	if got := vethtest.Addrs(t, a, "eth0"); len(got) != 0 {
		t.Errorf("L2 interface has addresses %v", got)
	}
	if err := lab.Check("a", a); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := lab.Status(); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	testutil.Run(t, "ip", "-n", testutil.NSName(lab.Host), "route", "del", "default")
	if err := lab.Status(); vethtest.Code(err) != 50 || !strings.Contains(err.Error(), "default route") {
		t.Errorf("STATUS without a default route: %v, want 50", err)
	}
	if err := lab.Del("a", a); err != nil {
		t.Fatal(err)
	}
	onlyLo(t, a)
}

// linkInContainer: the master is in the pod's netns.
func TestRootLinkInContainer(t *testing.T) {
	testutil.RequireFreeRange(t, "10.76.4.0/24")
	a := testutil.NewNetNS(t)
	testutil.Run(t, "ip", "-n", testutil.NSName(a), "link", "add", "mc0", "type", "veth", "peer", "name", "mc1")
	testutil.Run(t, "ip", "-n", testutil.NSName(a), "link", "set", "mc0", "up")
	requireMacvlan(t, a, "mc0")
	lab := vethtest.New(t, mvConf("mc0", `,"linkInContainer":true,"mtu":1400`, `"ranges":[[{"subnet":"10.76.4.0/24"}]]`))
	r := lab.MustAdd("a", a)
	mv, ok := link(t, a, "eth0").(*netlink.Macvlan)
	if !ok || mv.ParentIndex != link(t, a, "mc0").Attrs().Index || mv.MTU != 1400 {
		t.Fatalf("eth0 = %+v, want a macvlan on mc0 with MTU 1400", link(t, a, "eth0"))
	}
	if got := vethtest.Addrs(t, a, "eth0"); len(got) != 1 || got[0] != r.IPs[0].Address.String() {
		t.Errorf("addresses = %v, result %v", got, r.IPs)
	}
	if err := lab.Check("a", a); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := lab.Status(); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	if err := lab.Del("a", a); err != nil {
		t.Fatal(err)
	}
	onlyLo(t, a, "mc0", "mc1")
	if got := lab.Reservations(); len(got) != 0 {
		t.Errorf("reservations = %v", got)
	}
}

// Older conflists get results in their own version; CHECK (0.4.0 and
// later) reads the prevResult in that version.
func TestRootResultVersions(t *testing.T) {
	testutil.RequireFreeRange(t, "10.76.5.0/24")
	lab := vethtest.New(t, mvConf("x", "", ""))
	seg := newSegment(t, lab.Host)
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			l := lab.WithConf(strings.Replace(mvConf(seg.master, "", `"ranges":[[{"subnet":"10.76.5.0/24","gateway":"10.76.5.1"}]]`),
				`"cniVersion":"1.1.0"`, `"cniVersion":"`+v+`"`, 1))
			a := testutil.NewNetNS(t)
			res, err := l.AddRaw(vethtest.RT("a", a))
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != v {
				t.Errorf("result version %s, want %s", res.Version(), v)
			}
			r, err := current.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			if got := vethtest.Addrs(t, a, "eth0"); len(r.IPs) != 1 || !slices.Equal(got, []string{r.IPs[0].Address.String()}) {
				t.Errorf("addresses %v, result %+v", got, r.IPs)
			}
			if v != "0.3.1" { // CHECK arrived with 0.4.0
				if err := l.Check("a", a); err != nil {
					t.Errorf("CHECK: %v", err)
				}
			}
			if err := l.Del("a", a); err != nil {
				t.Fatal(err)
			}
			onlyLo(t, a)
		})
	}
	if got := lab.Reservations(); len(got) != 0 {
		t.Errorf("reservations = %v", got)
	}
}
