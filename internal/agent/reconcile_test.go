package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/masq"
	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/subnet"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
	"github.com/flatnet/flatnet/internal/nft"
)

func k8sNode(name, podCIDR, ip string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if podCIDR != "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	}
	if ip != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}
	}
	return n
}

type fakeNode struct {
	r      *Reconciler
	routes *routes.Fake
	vxlan  *vxlan.Fake
	nft    *nft.Fake
	sysctl map[string]string
	conf   string
	// patches are the annotation patches the reconciler sent.
	patches []map[string]*string
}

// fakeUnderlay is every fake node's underlay: eth0, MTU 1500, with the
// node IP on 10.250.0.0/24.
func fakeUnderlay(ip netip.Addr) (backend.Underlay, error) {
	if !netip.MustParsePrefix("10.250.0.0/16").Contains(ip) {
		return backend.Underlay{}, errors.New("no interface of this node has the address " + ip.String())
	}
	return backend.Underlay{IP: ip, Link: "eth0", Index: 2, MTU: 1500, Prefixes: []netip.Prefix{netip.PrefixFrom(ip, 24).Masked()}}, nil
}

func newFakeNode(t *testing.T, name string) *fakeNode {
	return newFakeNodeWith(t, name, backend.HostGW, backend.Config{VNI: 1, Port: 4789})
}

func newFakeNodeWith(t *testing.T, name, be string, cfg backend.Config) *fakeNode {
	f := &fakeNode{routes: routes.NewFake(), vxlan: vxlan.NewFake(), nft: nft.NewFake(knftables.InetFamily, masq.Table), sysctl: map[string]string{}}
	f.vxlan.OnDelete = f.routes.DeleteDevice
	dir := filepath.Join(t.TempDir(), "net.d")
	f.conf = filepath.Join(dir, subnet.FileName)
	b, err := backend.New(be, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.r = &Reconciler{
		NodeName:     name,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		CNIConfDir:   dir,
		CNIDataDir:   "/data",
		Backend:      b,
		Kernel:       backend.Kernel{Routes: f.routes, VXLAN: f.vxlan},
		FindUnderlay: fakeUnderlay,
		Annotate: func(_ context.Context, set map[string]*string) error {
			f.patches = append(f.patches, set)
			return nil
		},
		Masq:       masq.New(f.nft),
		Masquerade: true,
		Sysctl:     func(k, v string) error { f.sysctl[k] = v; return nil },
	}
	return f
}

// switchBackend gives f's reconciler another backend, on the same kernel:
// an agent restarted with another --backend.
func (f *fakeNode) switchBackend(t *testing.T, be string) {
	b, err := backend.New(be, backend.Config{VNI: 1, Port: 4789})
	if err != nil {
		t.Fatal(err)
	}
	r := *f.r
	r.Backend = b
	f.r = &r
}

// applyPatches applies f's annotation patches to n, as the API server
// would, and forgets them.
func (f *fakeNode) applyPatches(n *corev1.Node) {
	for _, p := range f.patches {
		for k, v := range p {
			if v == nil {
				delete(n.Annotations, k)
				continue
			}
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			n.Annotations[k] = *v
		}
	}
	f.patches = nil
}

func readConflistMTU(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Plugins []struct {
			Type string `json:"type"`
			MTU  int    `json:"mtu"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Plugins) == 0 || (c.Plugins[0].Type != "flatnet" && c.Plugins[0].Type != "bridge") {
		t.Fatalf("conflist:\n%s", data)
	}
	return c.Plugins[0].MTU
}

func TestReconcile(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t, "n1")

	// Before the controller gives n1 a subnet: routes, masquerade and
	// forwarding, but no conflist.
	nodes := []*corev1.Node{k8sNode("n1", "", "10.250.0.11"), k8sNode("n2", "10.244.2.0/24", "10.250.0.12")}
	if err := f.r.Reconcile(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.conf); !os.IsNotExist(err) {
		t.Errorf("conflist written without a podCIDR: %v", err)
	}
	if f.routes.Dump() != "10.244.2.0/24 via 10.250.0.12\n" {
		t.Errorf("routes:\n%s", f.routes.Dump())
	}
	if f.sysctl["net.ipv4.ip_forward"] != "1" || len(f.sysctl) != 1 {
		t.Errorf("sysctls %v", f.sysctl)
	}
	if !strings.Contains(f.nft.Dump(), "ip saddr 10.244.0.0/16 masquerade fully-random") {
		t.Errorf("nft:\n%s", f.nft.Dump())
	}

	// n1 gets its subnet, n3 joins.
	nodes = []*corev1.Node{k8sNode("n1", "10.244.1.0/24", "10.250.0.11"), k8sNode("n2", "10.244.2.0/24", "10.250.0.12"), k8sNode("n3", "10.244.3.0/24", "10.250.0.13")}
	if err := f.r.Reconcile(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.conf)
	if err != nil {
		t.Fatal(err)
	}
	// host-gw: the pod MTU is the underlay's.
	want, _ := subnet.Render(subnet.Config{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, DataDir: "/data", MTU: 1500})
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("conflist (-want +got):\n%s", d)
	}
	if f.routes.Dump() != "10.244.2.0/24 via 10.250.0.12\n10.244.3.0/24 via 10.250.0.13\n" {
		t.Errorf("routes:\n%s", f.routes.Dump())
	}

	// Idempotent: nothing is rewritten.
	st1, _ := os.Stat(f.conf)
	f.routes.Ops = 0
	runs := f.nft.Runs()
	dump := f.nft.Dump()
	if err := f.r.Reconcile(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	st2, _ := os.Stat(f.conf)
	if f.routes.Ops != 0 || f.nft.Runs() != runs || !os.SameFile(st1, st2) || f.nft.Dump() != dump {
		t.Errorf("second reconcile changed things: %d route ops, %d nft runs, same conflist file %v", f.routes.Ops, f.nft.Runs()-runs, os.SameFile(st1, st2))
	}

	// n2 leaves; a broken n4 is reported but does not block the rest.
	nodes = []*corev1.Node{nodes[0], nodes[2], k8sNode("n4", "10.244.4.0/24", "")}
	if err := f.r.Reconcile(ctx, nodes); err != nil {
		t.Fatal(err) // a peer without an address is logged, not an error
	}
	if f.routes.Dump() != "10.244.3.0/24 via 10.250.0.13\n" {
		t.Errorf("routes after n2 left:\n%s", f.routes.Dump())
	}

	// Masquerade turned off: the table goes.
	f.r.Masquerade = false
	if err := f.r.Reconcile(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	if d := f.nft.Dump(); d != "" {
		t.Errorf("nft after --masquerade=false:\n%s", d)
	}
}

func TestReconcileReportsFailuresButDoesTheRest(t *testing.T) {
	f := newFakeNode(t, "n1")
	f.routes.Reachable = netip.MustParsePrefix("10.250.0.0/24")
	f.r.Sysctl = func(string, string) error { return os.ErrPermission }
	nodes := []*corev1.Node{k8sNode("n1", "10.244.1.0/24", "10.250.0.11"), k8sNode("far", "10.244.2.0/24", "10.9.9.9"), k8sNode("n3", "10.244.3.0/24", "10.250.0.13")}
	err := f.r.Reconcile(context.Background(), nodes)
	if err == nil || !strings.Contains(err.Error(), "IPv4 forwarding") || !strings.Contains(err.Error(), "node far") {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(f.conf); err != nil {
		t.Errorf("conflist: %v", err)
	}
	if f.routes.Dump() != "10.244.3.0/24 via 10.250.0.13\n" {
		t.Errorf("routes:\n%s", f.routes.Dump())
	}
}

// TestReconcileConflistStyles: the agent writes the flatnet type by
// default and the classic chain with --cni-conflist classic; an agent
// restarted with the other style rewrites the file (the same network, so
// pods of either keep working and are torn down by the other), and
// switching back restores the first byte for byte.
func TestReconcileConflistStyles(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t, "n1")
	nodes := []*corev1.Node{k8sNode("n1", "10.244.1.0/24", "10.250.0.11")}
	types := func() []string {
		b, err := os.ReadFile(f.conf)
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			Name    string `json:"name"`
			Plugins []struct {
				Type string `json:"type"`
			} `json:"plugins"`
		}
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		out := []string{c.Name}
		for _, p := range c.Plugins {
			out = append(out, p.Type)
		}
		return out
	}
	restart := func(style, policy string) {
		r := *f.r
		r.CNIConflist, r.PolicySocket = style, policy
		f.r = &r
		if err := f.r.Reconcile(ctx, nodes); err != nil {
			t.Fatal(err)
		}
	}
	restart("", "")
	if d := cmp.Diff([]string{"flatnet", "flatnet"}, types()); d != "" {
		t.Errorf("default conflist (network, types) (-want +got):\n%s", d)
	}
	first, _ := os.ReadFile(f.conf)
	restart(subnet.StyleClassic, "")
	if d := cmp.Diff([]string{"flatnet", "bridge", "bandwidth", "portmap"}, types()); d != "" {
		t.Errorf("classic conflist (-want +got):\n%s", d)
	}
	restart(subnet.StyleClassic, "/run/p.sock")
	if d := cmp.Diff([]string{"flatnet", "bridge", "bandwidth", "portmap", "flatnet-policy"}, types()); d != "" {
		t.Errorf("classic conflist with the policy gate (-want +got):\n%s", d)
	}
	restart(subnet.StyleFlatnet, "/run/p.sock")
	if d := cmp.Diff([]string{"flatnet", "flatnet", "flatnet-policy"}, types()); d != "" {
		t.Errorf("flatnet conflist with the policy gate (-want +got):\n%s", d)
	}
	restart(subnet.StyleFlatnet, "")
	if again, _ := os.ReadFile(f.conf); string(again) != string(first) {
		t.Errorf("back to flatnet:\n%s\nwant:\n%s", again, first)
	}
}

func TestMissingPlugins(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	for _, p := range []string{filepath.Join(a, "bridge"), filepath.Join(b, "flatnet"), filepath.Join(b, "portmap")} {
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A directory named like a plugin is not one.
	if err := os.Mkdir(filepath.Join(a, "bandwidth"), 0o755); err != nil {
		t.Fatal(err)
	}
	dirs := a + string(filepath.ListSeparator) + b
	for _, tc := range []struct {
		style  string
		policy bool
		want   []string
	}{
		{subnet.StyleFlatnet, false, nil},
		{subnet.StyleFlatnet, true, []string{"flatnet-policy"}},
		{subnet.StyleClassic, false, []string{"host-local", "bandwidth"}},
	} {
		if got := missingPlugins(dirs, subnet.Plugins(tc.style, tc.policy)); !slices.Equal(got, tc.want) {
			t.Errorf("%s policy %v: missing %v, want %v", tc.style, tc.policy, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := Options{NodeName: "n", ClusterCIDR: "10.244.0.0/16", Backend: "host-gw", VXLANVNI: 1, VXLANPort: 4789, CNIConfDir: "/x", CNIConflist: "flatnet", Resync: 1}
	if _, err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Options){
		"node name":     func(o *Options) { o.NodeName = "" },
		"cidr":          func(o *Options) { o.ClusterCIDR = "10.244.0.1/16" },
		"backend":       func(o *Options) { o.Backend = "geneve" },
		"vxlan ipv6":    func(o *Options) { o.Backend, o.ClusterCIDR = "vxlan", "10.244.0.0/16,fd00:10:244::/56" },
		"vni 0":         func(o *Options) { o.VXLANVNI = 0 },
		"vni 2^24":      func(o *Options) { o.VXLANVNI = 1 << 24 },
		"port 0":        func(o *Options) { o.VXLANPort = 0 },
		"mtu small":     func(o *Options) { o.MTU = 67 },
		"mtu big":       func(o *Options) { o.MTU = 65536 },
		"mtu ipv6":      func(o *Options) { o.MTU, o.ClusterCIDR = 1279, "fd00:10:244::/56" },
		"node ip":       func(o *Options) { o.NodeIP = "node1" },
		"lab ip":        func(o *Options) { o.LabRuntime, o.RuntimeStateDir = true, "/s" },
		"lab state":     func(o *Options) { o.LabRuntime, o.NodeIP = true, "10.0.0.1" },
		"resync":        func(o *Options) { o.Resync = 0 },
		"cni conf":      func(o *Options) { o.CNIConfDir = "" },
		"cni conflist":  func(o *Options) { o.CNIConflist = "chain" },
		"conflist none": func(o *Options) { o.CNIConflist = "" },
		"cidr empty":    func(o *Options) { o.ClusterCIDR = "" },
		"direct ipv6":   func(o *Options) { o.Backend, o.ClusterCIDR = "vxlan-direct", "fd00:10:244::/56" },
		"negative mtu":  func(o *Options) { o.MTU = -1 },
		"unknown bknd2": func(o *Options) { o.Backend = "" },
		"cluster dns": func(o *Options) {
			o.LabRuntime, o.NodeIP, o.RuntimeStateDir, o.ClusterDomain, o.ClusterDNS = true, "10.0.0.1", "/s", "cluster.local", "10.96.0.10,dns"
		},
		"cluster domain": func(o *Options) { o.LabRuntime, o.NodeIP, o.RuntimeStateDir = true, "10.0.0.1", "/s" },
	} {
		o := ok
		mut(&o)
		if _, err := o.validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	for _, mut := range []func(*Options){
		func(o *Options) { o.ClusterCIDR = "10.244.0.0/16, fd00:10:244::/56" },
		func(o *Options) { o.Backend, o.VXLANVNI, o.VXLANPort, o.MTU = "vxlan", 1<<24-1, 8472, 1400 },
		func(o *Options) { o.Backend, o.NodeIP = "vxlan-direct", "10.0.0.1" },
		func(o *Options) { o.MTU = 9000 },
		func(o *Options) { o.CNIConflist = "classic" },
		func(o *Options) {
			o.LabRuntime, o.NodeIP, o.RuntimeStateDir, o.ClusterDomain, o.ClusterDNS = true, "10.0.0.1", "/s", "cluster.local", "10.96.0.10, fd00::a"
		},
		func(o *Options) {
			o.LabRuntime, o.NodeIP, o.RuntimeStateDir, o.ClusterDomain = true, "10.0.0.1", "/s", "c.test"
		},
	} {
		o := ok
		mut(&o)
		if _, err := o.validate(); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// TestReconcileVXLAN: the agent publishes its VTEP, programs peers as
// they publish theirs, writes the overlay MTU into the conflist, cleans up
// a departed peer, and a restart with another backend removes the device.
func TestReconcileVXLAN(t *testing.T) {
	ctx := context.Background()
	f := newFakeNodeWith(t, "n1", backend.VXLAN, backend.Config{VNI: 1, Port: 4789})
	n1, n2, n3 := k8sNode("n1", "10.244.1.0/24", "10.250.0.11"), k8sNode("n2", "10.244.2.0/24", "10.250.0.12"), k8sNode("n3", "10.244.3.0/24", "10.250.0.13")
	nodes := []*corev1.Node{n1, n2, n3}

	// Peers have not published a VTEP yet: the device, our address and
	// our annotations, no peer entries.
	if err := f.r.Reconcile(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	self := vxlan.MACFor("n1").String()
	if len(f.patches) != 1 || *f.patches[0][backend.AnnotationVTEPMAC] != self || *f.patches[0][backend.AnnotationPublicIP] != "10.250.0.11" ||
		*f.patches[0][backend.AnnotationBackend] != "vxlan" {
		t.Fatalf("patches: %v", f.patches)
	}
	f.applyPatches(n1)
	if f.routes.Dump() != "" {
		t.Errorf("routes to peers without a VTEP:\n%s", f.routes.Dump())
	}
	if got := readConflistMTU(t, f.conf); got != 1450 {
		t.Errorf("conflist mtu %d, want 1450 (1500 - 50)", got)
	}

	// They publish theirs (as their agents would).
	for _, n := range []*corev1.Node{n2, n3} {
		n.Annotations = map[string]string{backend.AnnotationBackend: "vxlan", backend.AnnotationVTEPMAC: vxlan.MACFor(n.Name).String(), backend.AnnotationPublicIP: n.Status.Addresses[1].Address}
	}
	if err := f.r.Reconcile(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	want := `10.244.2.0/24 via 10.244.2.0 dev flatnet.1 onlink
10.244.3.0/24 via 10.244.3.0 dev flatnet.1 onlink
link flatnet.1 vxlan=true vni 1 port 4789 local 10.250.0.11 dev#2 mac ` + self + ` mtu 1450 up=true txcsum=false
addr 10.244.1.0/32
neigh 10.244.2.0 lladdr ` + vxlan.MACFor("n2").String() + `
neigh 10.244.3.0 lladdr ` + vxlan.MACFor("n3").String() + `
`
	fdb := []string{"fdb " + vxlan.MACFor("n2").String() + " dst 10.250.0.12", "fdb " + vxlan.MACFor("n3").String() + " dst 10.250.0.13"}
	slices.Sort(fdb)
	want += strings.Join(fdb, "\n") + "\n"
	if d := cmp.Diff(want, f.routes.Dump()+f.vxlan.Dump(vxlan.DeviceName)); d != "" {
		t.Errorf("kernel (-want +got):\n%s", d)
	}

	// Reconcile twice: nothing changes, nothing is published again.
	f.routes.Ops, f.vxlan.Ops = 0, nil
	runs := f.nft.Runs()
	if err := f.r.Reconcile(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	if f.routes.Ops != 0 || len(f.vxlan.Ops) != 0 || f.nft.Runs() != runs || len(f.patches) != 0 {
		t.Errorf("second reconcile: %d route ops, device ops %v, %d nft runs, patches %v", f.routes.Ops, f.vxlan.Ops, f.nft.Runs()-runs, f.patches)
	}

	// n2 leaves: its route, neighbour and FDB entry go; n3's stay.
	if err := f.r.Reconcile(ctx, []*corev1.Node{n1, n3}); err != nil {
		t.Fatal(err)
	}
	if d := f.vxlan.Dump(vxlan.DeviceName); strings.Contains(d, vxlan.MACFor("n2").String()) || !strings.Contains(d, vxlan.MACFor("n3").String()) {
		t.Errorf("after n2 left:\n%s", d)
	}
	if f.routes.Dump() != "10.244.3.0/24 via 10.244.3.0 dev flatnet.1 onlink\n" {
		t.Errorf("routes after n2 left:\n%s", f.routes.Dump())
	}

	// --mtu overrides the conflist's MTU.
	f.r.Backend, _ = backend.New(backend.VXLAN, backend.Config{VNI: 1, Port: 4789, MTU: 1400})
	if err := f.r.Reconcile(ctx, []*corev1.Node{n1, n3}); err != nil {
		t.Fatal(err)
	}
	if got := readConflistMTU(t, f.conf); got != 1400 {
		t.Errorf("conflist mtu %d with --mtu 1400", got)
	}

	// Restart with host-gw: the device goes, routes are plain, and the
	// VTEP annotations are withdrawn.
	f.switchBackend(t, backend.HostGW)
	if err := f.r.Reconcile(ctx, []*corev1.Node{n1, n3}); err != nil {
		t.Fatal(err)
	}
	if len(f.vxlan.Links) != 0 || f.routes.Dump() != "10.244.3.0/24 via 10.250.0.13\n" {
		t.Errorf("after the switch to host-gw:\n%s%s", f.routes.Dump(), f.vxlan.Dump(vxlan.DeviceName))
	}
	if len(f.patches) != 1 || f.patches[0][backend.AnnotationVTEPMAC] != nil || f.patches[0][backend.AnnotationPublicIP] != nil || *f.patches[0][backend.AnnotationBackend] != "host-gw" {
		t.Errorf("patches: %v", f.patches)
	}
	f.applyPatches(n1)
	if _, ok := n1.Annotations[backend.AnnotationVTEPMAC]; ok || len(n1.Annotations) != 1 {
		t.Errorf("annotations: %v", n1.Annotations)
	}
	if got := readConflistMTU(t, f.conf); got != 1500 {
		t.Errorf("host-gw conflist mtu %d, want the underlay's 1500", got)
	}
}

// TestReconcileVXLANWaits: without the node's address the vxlan backend
// writes nothing (a conflist without the right MTU would start pods that
// cannot send full-size packets) and is not an error; an address on no
// interface is one, retried.
func TestReconcileVXLANWaits(t *testing.T) {
	ctx := context.Background()
	f := newFakeNodeWith(t, "n1", backend.VXLAN, backend.Config{VNI: 1, Port: 4789})
	nodes := []*corev1.Node{k8sNode("n1", "10.244.1.0/24", ""), k8sNode("n2", "10.244.2.0/24", "10.250.0.12")}
	if err := f.r.Reconcile(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.conf); !os.IsNotExist(err) || len(f.vxlan.Links) != 0 || len(f.patches) != 0 {
		t.Errorf("wrote things without a node IP: conflist %v, links %v, patches %v", err, f.vxlan.Links, f.patches)
	}
	if !strings.Contains(f.nft.Dump(), "masquerade") {
		t.Error("masquerade waits too")
	}
	f.r.NodeIP = netip.MustParseAddr("192.168.9.9")
	err := f.r.Reconcile(ctx, nodes)
	if err == nil || !strings.Contains(err.Error(), "no interface of this node holds its address 192.168.9.9") {
		t.Errorf("err = %v", err)
	}
	// --node-ip wins over the Node's InternalIP.
	f.r.NodeIP = netip.MustParseAddr("10.250.0.11")
	if err := f.r.Reconcile(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.vxlan.Dump(vxlan.DeviceName), "local 10.250.0.11") {
		t.Errorf("device:\n%s", f.vxlan.Dump(vxlan.DeviceName))
	}
}
