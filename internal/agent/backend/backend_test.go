package backend

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
)

// node is a Node; mac "" means no VXLAN annotations.
func node(name, cidr, ip, mac string) Node {
	n := Node{Name: name, Annotations: map[string]string{}}
	if cidr != "" {
		n.PodCIDRs = []string{cidr}
	}
	if ip != "" {
		n.InternalIPs = []string{ip}
	}
	if mac != "" {
		n.Annotations = map[string]string{AnnotationBackend: VXLAN, AnnotationVTEPMAC: mac, AnnotationPublicIP: ip}
	}
	return n
}

var underlay = Underlay{
	IP: netip.MustParseAddr("10.250.0.11"), Link: "eth0", Index: 2, MTU: 1500,
	Prefixes: []netip.Prefix{netip.MustParsePrefix("10.250.0.0/24")},
}

var cfg = Config{VNI: vxlan.DefaultVNI, Port: vxlan.DefaultPort}

func desired(t *testing.T, name string, c Config, in Input) (State, string) {
	t.Helper()
	b, err := New(name, c)
	if err != nil {
		t.Fatal(err)
	}
	if b.Name() != name {
		t.Errorf("Name() = %q", b.Name())
	}
	st, problems, err := b.Desired(in)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, p := range problems {
		msgs = append(msgs, p.Error())
	}
	return st, strings.Join(msgs, "\n")
}

func requireProblems(t *testing.T, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("problems lack %q:\n%s", w, got)
		}
	}
	if n := len(strings.Split(got, "\n")); got != "" && n != len(want) || got == "" && len(want) > 0 {
		t.Errorf("%d problems, want %d:\n%s", n, len(want), got)
	}
}

func TestHostGW(t *testing.T) {
	st, problems := desired(t, HostGW, cfg, Input{Self: "n1", Underlay: underlay, Nodes: []Node{
		node("n1", "10.244.1.0/24", "10.250.0.11", ""),
		node("n2", "10.244.2.0/24", "10.250.0.12", "02:00:00:00:00:02"),
		node("n3", "10.244.3.0/24", "10.250.1.13", ""),
	}})
	want := `annotation flatnet.io/backend=host-gw
annotation flatnet.io/public-ip=
annotation flatnet.io/vtep-mac=
pod mtu 1500
route 10.244.2.0/24 via 10.250.0.12 (n2)
route 10.244.3.0/24 via 10.250.1.13 (n3)
`
	if d := cmp.Diff(want, st.String()); d != "" {
		t.Errorf("state (-want +got):\n%s", d)
	}
	requireProblems(t, problems)

	// MTU: the underlay's, unless overridden, and unknown without one.
	c := cfg
	c.MTU = 9000
	if st, _ := desired(t, HostGW, c, Input{Self: "n1", Underlay: underlay}); st.PodMTU != 9000 {
		t.Errorf("--mtu 9000: %d", st.PodMTU)
	}
	if st, _ := desired(t, HostGW, cfg, Input{Self: "n1"}); st.PodMTU != 0 {
		t.Errorf("no underlay: %d", st.PodMTU)
	}
}

func TestVXLAN(t *testing.T) {
	self := vxlan.MACFor("n1").String()
	st, problems := desired(t, VXLAN, cfg, Input{Self: "n1", Underlay: underlay, Nodes: []Node{
		node("n3", "10.244.3.0/24", "10.250.1.13", "02:00:00:00:00:03"), // another subnet: fine for vxlan
		node("n1", "10.244.1.0/24", "10.250.0.11", self),
		node("n2", "10.244.2.0/24", "10.250.0.12", "02:00:00:00:00:02"),
		node("nomac", "10.244.4.0/24", "10.250.0.14", ""),
		node("new", "", "10.250.0.15", "02:00:00:00:00:05"), // no podCIDR yet: nothing, quietly
		node("x-dupmac", "10.244.6.0/24", "10.250.0.16", "02:00:00:00:00:02"),
		node("thief", "10.244.1.0/24", "10.250.0.17", "02:00:00:00:00:07"),
		node("v6", "fd00:8::/64", "10.250.0.18", "02:00:00:00:00:08"),
		node("noip", "10.244.9.0/24", "", "02:00:00:00:00:09"),
		node("badmac", "10.244.10.0/24", "10.250.0.20", "zz"),
		node("me", "10.244.11.0/24", "10.250.0.11", "02:00:00:00:00:11"),
	}})
	want := `annotation flatnet.io/backend=vxlan
annotation flatnet.io/public-ip=10.250.0.11
annotation flatnet.io/vtep-mac=` + self + `
pod mtu 1450
device flatnet.1 vni 1 port 4789 local 10.250.0.11 dev eth0 mac ` + self + ` mtu 1450 txcsum false
addr 10.244.1.0/32
route 10.244.2.0/24 via 10.244.2.0 dev flatnet.1 onlink (n2)
route 10.244.3.0/24 via 10.244.3.0 dev flatnet.1 onlink (n3)
neigh 10.244.2.0 lladdr 02:00:00:00:00:02 (n2)
neigh 10.244.3.0 lladdr 02:00:00:00:00:03 (n3)
fdb 02:00:00:00:00:02 dst 10.250.0.12 (n2)
fdb 02:00:00:00:00:03 dst 10.250.1.13 (n3)
`
	if d := cmp.Diff(want, st.String()); d != "" {
		t.Errorf("state (-want +got):\n%s", d)
	}
	requireProblems(t, problems,
		`node badmac: annotation flatnet.io/vtep-mac="zz"`,
		"node x-dupmac: VTEP MAC 02:00:00:00:00:02 is also node n2's",
		"node me: underlay address 10.250.0.11 is this node's own",
		"node noip: no underlay address",
		`node nomac has not published its VTEP MAC (flatnet.io/vtep-mac; its flatnet.io/backend annotation is "")`,
		"node thief: podCIDR 10.244.1.0/24 is also node n1's",
		"node v6: podCIDR fd00:8::/64: the vxlan backend carries IPv4 pod subnets only",
	)

	// The published public IP wins over the InternalIP.
	n2 := node("n2", "10.244.2.0/24", "10.250.0.12", "02:00:00:00:00:02")
	n2.Annotations[AnnotationPublicIP] = "10.250.9.12"
	st, _ = desired(t, VXLAN, cfg, Input{Self: "n1", Underlay: underlay, Nodes: []Node{n2}})
	if !strings.Contains(st.String(), "fdb 02:00:00:00:00:02 dst 10.250.9.12 (n2)") {
		t.Errorf("public-ip ignored:\n%s", st)
	}

	// Flags: VNI, port, offload, MTU override (a larger one is a problem).
	c := Config{VNI: 7, Port: 8472, TxChecksumOffload: true, MTU: 1460}
	st, problems = desired(t, VXLAN, c, Input{Self: "n1", Underlay: underlay})
	if !strings.Contains(st.String(), "device flatnet.1 vni 7 port 8472 local 10.250.0.11 dev eth0 mac "+self+" mtu 1450 txcsum true") || st.PodMTU != 1460 {
		t.Errorf("flags:\n%s", st)
	}
	requireProblems(t, problems, "--mtu 1460 is larger than the overlay's 1450")
}

func TestVXLANNeedsUnderlay(t *testing.T) {
	b, _ := New(VXLAN, cfg)
	for _, tc := range []struct {
		u    Underlay
		want string
	}{
		{Underlay{}, "underlay address is not known yet"},
		{Underlay{IP: underlay.IP}, "no interface of this node holds its address 10.250.0.11"},
		{Underlay{IP: underlay.IP, Link: "eth0", Index: 2, MTU: 100}, "MTU 100, too small"},
	} {
		if _, _, err := b.Desired(Input{Self: "n1", Underlay: tc.u}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v", tc.u, err)
		}
	}
	if _, err := New("geneve", cfg); err == nil || !strings.Contains(err.Error(), "host-gw, vxlan, vxlan-direct") {
		t.Errorf("New(geneve): %v", err)
	}
}

func TestVXLANDirect(t *testing.T) {
	self := vxlan.MACFor("n1").String()
	st, problems := desired(t, VXLANDirect, cfg, Input{Self: "n1", Underlay: underlay, Nodes: []Node{
		node("n1", "10.244.1.0/24", "10.250.0.11", self),
		node("n2", "10.244.2.0/24", "10.250.0.12", "02:00:00:00:00:02"), // same subnet: direct
		node("n3", "10.244.3.0/24", "10.250.1.13", "02:00:00:00:00:03"), // other subnet: vxlan
		node("hgw", "10.244.4.0/24", "10.250.0.14", ""),                 // same subnet, no MAC: direct anyway
		node("far", "10.244.5.0/24", "10.250.1.15", ""),                 // other subnet, no MAC: unreachable
	}})
	want := `annotation flatnet.io/backend=vxlan-direct
annotation flatnet.io/public-ip=10.250.0.11
annotation flatnet.io/vtep-mac=` + self + `
pod mtu 1450
device flatnet.1 vni 1 port 4789 local 10.250.0.11 dev eth0 mac ` + self + ` mtu 1450 txcsum false
addr 10.244.1.0/32
route 10.244.2.0/24 via 10.250.0.12 (n2)
route 10.244.3.0/24 via 10.244.3.0 dev flatnet.1 onlink (n3)
route 10.244.4.0/24 via 10.250.0.14 (hgw)
neigh 10.244.3.0 lladdr 02:00:00:00:00:03 (n3)
fdb 02:00:00:00:00:03 dst 10.250.1.13 (n3)
`
	if d := cmp.Diff(want, st.String()); d != "" {
		t.Errorf("state (-want +got):\n%s", d)
	}
	requireProblems(t, problems, "node far has not published its VTEP MAC")
}

// fakeKernel is a node's routing table and VXLAN device; deleting the
// device drops the routes through it.
type fakeKernel struct {
	routes *routes.Fake
	vxlan  *vxlan.Fake
}

func newFakeKernel() fakeKernel {
	k := fakeKernel{routes: routes.NewFake(), vxlan: vxlan.NewFake()}
	k.vxlan.OnDelete = k.routes.DeleteDevice
	return k
}

func (k fakeKernel) Kernel() Kernel { return Kernel{Routes: k.routes, VXLAN: k.vxlan} }

func (k fakeKernel) dump() string {
	return k.routes.Dump() + k.vxlan.Dump(vxlan.DeviceName)
}

// TestApplySequence walks one node's kernel through peers joining,
// moving, changing MAC and leaving, and through backend switches, and
// checks the kernel after each step and that a repeat changes nothing.
func TestApplySequence(t *testing.T) {
	k := newFakeKernel()
	self := vxlan.MACFor("n1")
	var n1 Node
	step := func(backend string, nodes []Node, want string) {
		t.Helper()
		st, problems := desired(t, backend, cfg, Input{Self: "n1", Underlay: underlay, Nodes: append([]Node{n1}, nodes...)})
		if problems != "" {
			t.Fatal(problems)
		}
		if _, err := Apply(k.Kernel(), st); err != nil {
			t.Fatal(err)
		}
		want = strings.ReplaceAll(want, "SELF", self.String())
		if d := cmp.Diff(want, k.dump()); d != "" {
			t.Errorf("%s: kernel (-want +got):\n%s", backend, d)
		}
		// Idempotent.
		k.routes.Ops, k.vxlan.Ops = 0, nil
		res, err := Apply(k.Kernel(), st)
		if err != nil || k.routes.Ops != 0 || len(k.vxlan.Ops) != 0 || res.RemovedDevice {
			t.Errorf("%s: second apply: %v, route ops %d, device ops %v", backend, err, k.routes.Ops, k.vxlan.Ops)
		}
	}
	n1 = node("n1", "10.244.1.0/24", "10.250.0.11", "")
	n2 := node("n2", "10.244.2.0/24", "10.250.0.12", "02:00:00:00:00:02")
	n3 := node("n3", "10.244.3.0/24", "10.250.1.13", "02:00:00:00:00:03")
	step(HostGW, []Node{n2, n3}, "10.244.2.0/24 via 10.250.0.12\n10.244.3.0/24 via 10.250.1.13\n")

	// Switch to vxlan: routes move onto the device, which appears.
	n1 = node("n1", "10.244.1.0/24", "10.250.0.11", self.String())
	dev := "link flatnet.1 vxlan=true vni 1 port 4789 local 10.250.0.11 dev#2 mac SELF mtu 1450 up=true txcsum=false\naddr 10.244.1.0/32\n"
	step(VXLAN, []Node{n2, n3}, `10.244.2.0/24 via 10.244.2.0 dev flatnet.1 onlink
10.244.3.0/24 via 10.244.3.0 dev flatnet.1 onlink
`+dev+`neigh 10.244.2.0 lladdr 02:00:00:00:00:02
neigh 10.244.3.0 lladdr 02:00:00:00:00:03
fdb 02:00:00:00:00:02 dst 10.250.0.12
fdb 02:00:00:00:00:03 dst 10.250.1.13
`)
	// n3's underlay address changes: its FDB entry follows (one replace).
	k.vxlan.Ops = nil
	n3 = node("n3", "10.244.3.0/24", "10.250.1.23", "02:00:00:00:00:03")
	step(VXLAN, []Node{n2, n3}, `10.244.2.0/24 via 10.244.2.0 dev flatnet.1 onlink
10.244.3.0/24 via 10.244.3.0 dev flatnet.1 onlink
`+dev+`neigh 10.244.2.0 lladdr 02:00:00:00:00:02
neigh 10.244.3.0 lladdr 02:00:00:00:00:03
fdb 02:00:00:00:00:02 dst 10.250.0.12
fdb 02:00:00:00:00:03 dst 10.250.1.23
`)
	// n3's MAC changes (its device was re-created with another MAC).
	n3 = node("n3", "10.244.3.0/24", "10.250.1.23", "02:00:00:00:00:33")
	step(VXLAN, []Node{n2, n3}, `10.244.2.0/24 via 10.244.2.0 dev flatnet.1 onlink
10.244.3.0/24 via 10.244.3.0 dev flatnet.1 onlink
`+dev+`neigh 10.244.2.0 lladdr 02:00:00:00:00:02
neigh 10.244.3.0 lladdr 02:00:00:00:00:33
fdb 02:00:00:00:00:02 dst 10.250.0.12
fdb 02:00:00:00:00:33 dst 10.250.1.23
`)
	// n2 leaves: its route, neighbour and FDB entry go.
	step(VXLAN, []Node{n3}, `10.244.3.0/24 via 10.244.3.0 dev flatnet.1 onlink
`+dev+`neigh 10.244.3.0 lladdr 02:00:00:00:00:33
fdb 02:00:00:00:00:33 dst 10.250.1.23
`)
	// n2 is back, and the backend is vxlan-direct: n2 (same subnet) by a
	// plain route, n3 through the device.
	step(VXLANDirect, []Node{n2, n3}, `10.244.2.0/24 via 10.250.0.12
10.244.3.0/24 via 10.244.3.0 dev flatnet.1 onlink
`+dev+`neigh 10.244.3.0 lladdr 02:00:00:00:00:33
fdb 02:00:00:00:00:33 dst 10.250.1.23
`)
	// Back to host-gw: the device goes, every route is a plain one.
	step(HostGW, []Node{n2, n3}, "10.244.2.0/24 via 10.250.0.12\n10.244.3.0/24 via 10.250.1.23\n")
	// Everyone leaves.
	step(HostGW, nil, "")
}

// TestApplyDeviceFailure: a device that cannot be created keeps its
// routes out, but the plain routes of vxlan-direct are still programmed.
func TestApplyDeviceFailure(t *testing.T) {
	k := newFakeKernel()
	k.routes.Devices = []string{"eth0"} // flatnet.1 never appears
	k.vxlan.Links[vxlan.DeviceName] = &vxlan.FakeLink{Link: vxlan.Link{Name: vxlan.DeviceName, IsVXLAN: true, VNI: 1, Port: 4789, Local: underlay.IP, UnderlayIndex: 2, UDPCSum: true, MTU: 1450, Up: true}}
	st, _ := desired(t, VXLANDirect, cfg, Input{Self: "n1", Underlay: underlay, Nodes: []Node{
		node("n2", "10.244.2.0/24", "10.250.0.12", "02:00:00:00:00:02"),
		node("n3", "10.244.3.0/24", "10.250.1.13", "02:00:00:00:00:03"),
	}})
	_, err := Apply(k.Kernel(), st)
	if err == nil || !strings.Contains(err.Error(), "no such device flatnet.1") {
		t.Fatalf("err = %v", err)
	}
	if got := k.routes.Dump(); got != "10.244.2.0/24 via 10.250.0.12\n" {
		t.Errorf("routes:\n%s", got)
	}
}

func TestPodMTU(t *testing.T) {
	v6 := Underlay{IP: netip.MustParseAddr("fd00:250::11"), Link: "eth0", Index: 2, MTU: 1500}
	jumbo := underlay
	jumbo.MTU = 9000
	for _, tc := range []struct {
		backend  string
		underlay Underlay
		override int
		want     int
	}{
		{HostGW, underlay, 0, 1500},
		{HostGW, jumbo, 0, 9000},
		{HostGW, Underlay{}, 0, 0}, // unknown: the plugin's default
		{HostGW, underlay, 1400, 1400},
		{VXLAN, underlay, 0, 1450},
		{VXLAN, jumbo, 0, 8950},
		{VXLAN, v6, 0, 1430}, // IPv6 outer header: 70 bytes
		{VXLAN, underlay, 1300, 1300},
		{VXLANDirect, underlay, 0, 1450}, // overlay MTU even towards direct peers
		{VXLANDirect, jumbo, 0, 8950},
	} {
		c := cfg
		c.MTU = tc.override
		st, _ := desired(t, tc.backend, c, Input{Self: "n1", Underlay: tc.underlay})
		if st.PodMTU != tc.want {
			t.Errorf("%s, underlay %s MTU %d, --mtu %d: pod MTU %d, want %d", tc.backend, tc.underlay.IP, tc.underlay.MTU, tc.override, st.PodMTU, tc.want)
		}
		if st.VXLAN != nil && st.VXLAN.Device.MTU != tc.underlay.MTU-vxlan.Overhead(tc.underlay.IP) {
			t.Errorf("%s: device MTU %d", tc.backend, st.VXLAN.Device.MTU)
		}
	}
}
