package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/masq"
	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/subnet"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
	"github.com/flatnet/flatnet/internal/netexec"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// The overlay root test's world: a router namespace joining two underlay
// subnets, and three node namespaces, each with a cni0 bridge and one pod:
//
//	n1 10.251.78.11 ─┐ brA 10.251.78.1          pod i: 10.252.i.5 on node i's
//	n2 10.251.78.12 ─┘    router (forwarding)    cni0 (10.252.i.1/24)
//	n3 10.251.79.13 ──── brB 10.251.79.1
//
// The router knows nothing of pod subnets, so a pod packet from n1 reaches
// n3 only through the overlay.
const (
	ovSubnetA = "10.251.78.0/24"
	ovSubnetB = "10.251.79.0/24"
	ovCluster = "10.252.0.0/16"
)

type ovNode struct {
	name, ns, pod string
	ip            string
	conf          string
	r             *Reconciler
}

type overlayWorld struct {
	router string
	nodes  []*ovNode
	// objs are the Node objects, as the API server holds them: the
	// reconcilers' annotation patches land here.
	objs map[string]*corev1.Node
}

func newOverlayWorld(t *testing.T, be string) *overlayWorld {
	testutil.RequireRoot(t)
	testutil.RequireFreeRange(t, ovSubnetA, ovSubnetB, ovCluster)
	w := &overlayWorld{router: testutil.NewNetNS(t), objs: map[string]*corev1.Node{}}
	rn := testutil.NSName(w.router)
	for _, br := range []struct{ name, addr string }{{"brA", "10.251.78.1/24"}, {"brB", "10.251.79.1/24"}} {
		testutil.Run(t, "ip", "-n", rn, "link", "add", br.name, "type", "bridge")
		testutil.Run(t, "ip", "-n", rn, "addr", "add", br.addr, "dev", br.name)
		testutil.Run(t, "ip", "-n", rn, "link", "set", br.name, "up")
	}
	testutil.RunIn(t, w.router, "sysctl", "-qw", "net.ipv4.ip_forward=1")

	for i, ip := range []string{"10.251.78.11", "10.251.78.12", "10.251.79.13"} {
		n := &ovNode{name: fmt.Sprintf("n%d", i+1), ns: testutil.NewNetNS(t), pod: testutil.NewNetNS(t), ip: ip}
		nsn := testutil.NSName(n.ns)
		br, gw, other := "brA", "10.251.78.1", ovSubnetB
		if strings.HasPrefix(ip, "10.251.79.") {
			br, gw, other = "brB", "10.251.79.1", ovSubnetA
		}
		port := fmt.Sprintf("u%d", i+1)
		testutil.Wire(t, n.ns, "eth0", []string{ip + "/24"}, w.router, port, nil)
		testutil.Run(t, "ip", "-n", rn, "link", "set", port, "master", br)
		testutil.Run(t, "ip", "-n", nsn, "route", "add", other, "via", gw)

		sub := fmt.Sprintf("10.252.%d", i+1)
		testutil.Run(t, "ip", "-n", nsn, "link", "add", "cni0", "type", "bridge")
		testutil.Run(t, "ip", "-n", nsn, "addr", "add", sub+".1/24", "dev", "cni0")
		testutil.Run(t, "ip", "-n", nsn, "link", "set", "cni0", "up")
		testutil.Wire(t, n.pod, "eth0", []string{sub + ".5/24"}, n.ns, "vpod", nil)
		testutil.Run(t, "ip", "-n", nsn, "link", "set", "vpod", "master", "cni0")
		testutil.Run(t, "ip", "-n", testutil.NSName(n.pod), "route", "add", "default", "via", sub+".1")

		m, err := masq.NewDefault()
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(t.TempDir(), "net.d")
		n.conf = filepath.Join(dir, subnet.FileName)
		n.r = &Reconciler{
			NodeName:     n.name,
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(ovCluster)},
			CNIConfDir:   dir,
			Kernel:       backend.Kernel{Routes: &routes.Netlink{}, VXLAN: vxlan.Netlink{}},
			Annotate:     w.annotator(n.name),
			Masq:         m,
			Masquerade:   true,
		}
		w.nodes = append(w.nodes, n)
		w.objs[n.name] = k8sNode(n.name, sub+".0/24", ip)
	}
	w.setBackend(t, be, w.nodes...)
	return w
}

func (w *overlayWorld) annotator(name string) func(context.Context, map[string]*string) error {
	return func(_ context.Context, set map[string]*string) error {
		n := w.objs[name]
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		for k, v := range set {
			if v == nil {
				delete(n.Annotations, k)
			} else {
				n.Annotations[k] = *v
			}
		}
		return nil
	}
}

// setBackend restarts the agents of nodes with backend be.
func (w *overlayWorld) setBackend(t *testing.T, be string, nodes ...*ovNode) {
	t.Helper()
	b, err := backend.New(be, backend.Config{VNI: vxlan.DefaultVNI, Port: vxlan.DefaultPort})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		n.r.Backend = b
	}
}

// list is the Node list the agents see (all but the names in without).
func (w *overlayWorld) list(without ...string) []*corev1.Node {
	var out []*corev1.Node
	for _, n := range w.nodes {
		if !contains(without, n.name) {
			out = append(out, w.objs[n.name])
		}
	}
	return out
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// reconcile runs n's agent once; errors are the caller's to judge.
func (n *ovNode) reconcile(nodes []*corev1.Node) error {
	return netns.Do(n.ns, func() error { return n.r.Reconcile(context.Background(), nodes) })
}

// converge reconciles every node in the list twice (the first round
// publishes the VTEPs, the second programs them) and fails on errors.
func (w *overlayWorld) converge(t *testing.T, without ...string) {
	t.Helper()
	for range 2 {
		for _, n := range w.nodes {
			if contains(without, n.name) {
				continue
			}
			if err := n.reconcile(w.list(without...)); err != nil {
				t.Fatalf("reconcile on %s: %v", n.name, err)
			}
		}
	}
}

// kernel is what the agent owns in n's namespace, as the debugging
// commands of docs/overlay.md show it.
func (n *ovNode) kernel(t *testing.T) string {
	t.Helper()
	nsn := testutil.NSName(n.ns)
	var b strings.Builder
	b.WriteString("routes:\n" + flatnetRoutes(t, nsn))
	if !strings.Contains(testutil.Run(t, "ip", "-n", nsn, "link", "show"), vxlan.DeviceName) {
		b.WriteString("no " + vxlan.DeviceName + "\n")
		return b.String()
	}
	b.WriteString("link:\n" + testutil.Run(t, "ip", "-n", nsn, "-d", "link", "show", vxlan.DeviceName))
	b.WriteString("addr:\n" + testutil.Run(t, "ip", "-n", nsn, "-4", "addr", "show", "dev", vxlan.DeviceName))
	b.WriteString("neigh:\n" + testutil.Run(t, "ip", "-n", nsn, "neigh", "show", "dev", vxlan.DeviceName))
	b.WriteString("fdb:\n" + testutil.Run(t, "ip", "netns", "exec", nsn, "bridge", "fdb", "show", "dev", vxlan.DeviceName))
	return b.String()
}

func requireLines(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, got)
		}
	}
}

// setPodMTU sets the MTU of a pod's interface pair, as the bridge plugin
// does from the conflist's "mtu".
func (n *ovNode) setPodMTU(t *testing.T, mtu int) {
	t.Helper()
	testutil.Run(t, "ip", "-n", testutil.NSName(n.pod), "link", "set", "eth0", "mtu", fmt.Sprint(mtu))
	testutil.Run(t, "ip", "-n", testutil.NSName(n.ns), "link", "set", "vpod", "mtu", fmt.Sprint(mtu))
}

func TestRootVXLAN(t *testing.T) {
	w := newOverlayWorld(t, backend.VXLAN)
	n1, n2, n3 := w.nodes[0], w.nodes[1], w.nodes[2]
	w.converge(t)

	// What n1 programmed: one device, and per peer one route, one
	// neighbour and one FDB entry.
	mac2, mac3 := vxlan.MACFor("n2").String(), vxlan.MACFor("n3").String()
	k1 := n1.kernel(t)
	requireLines(t, "n1", k1,
		"10.252.2.0/24 via 10.252.2.0 dev flatnet.1 onlink",
		"10.252.3.0/24 via 10.252.3.0 dev flatnet.1 onlink",
		"vxlan id 1 local 10.251.78.11 dev eth0", "dstport 4789", "nolearning", "mtu 1450",
		"link/ether "+vxlan.MACFor("n1").String(),
		"inet 10.252.1.0/32",
		"10.252.2.0 lladdr "+mac2+" PERMANENT", "10.252.3.0 lladdr "+mac3+" PERMANENT",
		mac2+" dst 10.251.78.12 self permanent", mac3+" dst 10.251.79.13 self permanent",
	)
	if got := strings.Count(k1, " via "); got != 2 {
		t.Errorf("%d routes on n1:\n%s", got, k1)
	}
	if a := w.objs["n3"].Annotations; a[backend.AnnotationVTEPMAC] != mac3 || a[backend.AnnotationPublicIP] != "10.251.79.13" || a[backend.AnnotationBackend] != "vxlan" {
		t.Errorf("n3's annotations: %v", a)
	}
	for _, n := range w.nodes {
		if got := readConflistMTU(t, n.conf); got != 1450 {
			t.Errorf("%s: conflist mtu %d, want 1450", n.name, got)
		}
		n.setPodMTU(t, 1450)
	}

	// Pod to pod across nodes, across the router: delivered with the
	// client's own address (never masqueraded).
	pod3 := testutil.EchoServer(t, n3.pod, "10.252.3.5:0", "pod3")
	if got, err := testutil.Ask(n1.pod, pod3); err != nil || got != "pod3 10.252.1.5" {
		t.Fatalf("pod1 -> pod3: %q, %v", got, err)
	}
	pod2 := testutil.EchoServer(t, n2.pod, "10.252.2.5:0", "pod2")
	if got, err := testutil.Ask(n3.pod, pod2); err != nil || got != "pod2 10.252.3.5" {
		t.Fatalf("pod3 -> pod2: %q, %v", got, err)
	}
	// A node reaches a remote pod from its VTEP address.
	if got, err := testutil.Ask(n1.ns, pod3); err != nil || got != "pod3 10.252.1.0" {
		t.Fatalf("node1 -> pod3: %q, %v", got, err)
	}
	// Leaving the cluster: masqueraded to the node's address.
	ext := testutil.EchoServer(t, w.router, "10.251.79.1:0", "ext")
	if got, err := testutil.Ask(n1.pod, ext); err != nil || got != "ext 10.251.78.11" {
		t.Fatalf("pod1 -> outside: %q, %v (want node1's address)", got, err)
	}

	// MTU: a full-size packet (pod MTU, DF set) crosses; one byte more
	// cannot leave the pod; and a pod whose MTU is too big gets ICMP
	// "fragmentation needed" naming the overlay's MTU from its node.
	var srv *netexec.Server
	if err := netns.Do(n3.pod, func() error {
		var err error
		srv, err = netexec.Start(netexec.Config{Addr: "10.252.3.5", HTTPPort: -1, UDPPort: 0, TCPPort: -1})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { done <- srv.Wait(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	to := netip.MustParseAddrPort(srv.UDPAddr())
	probe := func(size int) netexec.ProbeResult {
		t.Helper()
		var res netexec.ProbeResult
		if err := netns.Do(n1.pod, func() error {
			var err error
			res, err = netexec.ProbeDF(context.Background(), to, size, 3, time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := probe(1450); res.Result != netexec.ProbeDelivered {
		t.Errorf("1450 bytes, DF: %+v", res)
	}
	if res := probe(1451); res.Result != netexec.ProbeLocalTooBig || res.MTU != 1450 {
		t.Errorf("1451 bytes from a pod with MTU 1450: %+v", res)
	}
	n1.setPodMTU(t, 1500)
	if res := probe(1451); res.Result != netexec.ProbeFragNeeded || res.MTU != 1450 || res.From != "10.252.1.1" {
		t.Errorf("1451 bytes from a pod with MTU 1500: %+v (want frag-needed, MTU 1450, from node1's cni0 10.252.1.1)", res)
	}
	if res := probe(1450); res.Result != netexec.ProbeDelivered {
		t.Errorf("1450 bytes after the ICMP: %+v", res)
	}
	n1.setPodMTU(t, 1450)

	// Reconcile twice: the kernel is unchanged.
	before := n1.kernel(t)
	if err := n1.reconcile(w.list()); err != nil {
		t.Fatal(err)
	}
	if after := n1.kernel(t); after != before {
		t.Errorf("second reconcile changed n1:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// n2 leaves: its route, neighbour and FDB entry go everywhere, n3's
	// stay.
	w.converge(t, "n2")
	for _, n := range []*ovNode{n1, n3} {
		if k := n.kernel(t); strings.Contains(k, "10.252.2.0") || strings.Contains(k, mac2) {
			t.Errorf("%s still has n2's entries:\n%s", n.name, k)
		}
	}
	if got, err := testutil.Ask(n1.pod, pod3); err != nil || got != "pod3 10.252.1.5" {
		t.Fatalf("pod1 -> pod3 after n2 left: %q, %v", got, err)
	}
	if got, err := testutil.Ask(n1.pod, pod2); err == nil {
		t.Errorf("pod2 reachable after its node left: %q", got)
	}

	// n3 moves to another underlay address: its device follows, it
	// publishes the address, and n1's FDB entry is replaced.
	nsn3 := testutil.NSName(n3.ns)
	testutil.RunIn(t, n3.ns, "sysctl", "-qw", "net.ipv4.conf.eth0.promote_secondaries=1")
	testutil.Run(t, "ip", "-n", nsn3, "addr", "add", "10.251.79.23/24", "dev", "eth0")
	testutil.Run(t, "ip", "-n", nsn3, "addr", "del", "10.251.79.13/24", "dev", "eth0")
	testutil.Run(t, "ip", "-n", nsn3, "route", "replace", ovSubnetA, "via", "10.251.79.1")
	w.objs["n3"].Status.Addresses[1].Address = "10.251.79.23"
	w.converge(t, "n2")
	requireLines(t, "n1 after n3 moved", n1.kernel(t), mac3+" dst 10.251.79.23 self permanent")
	requireLines(t, "n3 after it moved", n3.kernel(t), "vxlan id 1 local 10.251.79.23 dev eth0")
	if got, err := testutil.Ask(n1.pod, pod3); err != nil || got != "pod3 10.252.1.5" {
		t.Fatalf("pod1 -> pod3 after n3 moved: %q, %v", got, err)
	}
}

// TestRootBackendSwitch: agents restarted with another backend remove the
// old one's state: vxlan -> vxlan-direct (n1-n2 on one subnet go direct,
// n3 stays on the overlay) -> host-gw (the device goes; n3, behind a
// router, cannot be reached and the agent says why).
func TestRootBackendSwitch(t *testing.T) {
	w := newOverlayWorld(t, backend.VXLAN)
	n1, n2, n3 := w.nodes[0], w.nodes[1], w.nodes[2]
	w.converge(t)
	pod2 := testutil.EchoServer(t, n2.pod, "10.252.2.5:0", "pod2")
	pod3 := testutil.EchoServer(t, n3.pod, "10.252.3.5:0", "pod3")
	if got, err := testutil.Ask(n1.pod, pod2); err != nil || got != "pod2 10.252.1.5" {
		t.Fatalf("vxlan: pod1 -> pod2: %q, %v", got, err)
	}

	w.setBackend(t, backend.VXLANDirect, w.nodes...)
	w.converge(t)
	k1 := n1.kernel(t)
	requireLines(t, "n1 (vxlan-direct)", k1,
		"10.252.2.0/24 via 10.251.78.12 dev eth0",
		"10.252.3.0/24 via 10.252.3.0 dev flatnet.1 onlink",
		"10.252.3.0 lladdr "+vxlan.MACFor("n3").String()+" PERMANENT",
		vxlan.MACFor("n3").String()+" dst 10.251.79.13 self permanent",
	)
	if strings.Contains(k1, vxlan.MACFor("n2").String()) || strings.Contains(k1, "10.252.2.0 lladdr") {
		t.Errorf("n1 keeps overlay entries for the direct peer n2:\n%s", k1)
	}
	for _, n := range w.nodes {
		if got := readConflistMTU(t, n.conf); got != 1450 {
			t.Errorf("%s: vxlan-direct conflist mtu %d, want the overlay's 1450", n.name, got)
		}
	}
	for _, c := range []struct {
		from *ovNode
		to   string
		want string
	}{{n1, pod2, "pod2 10.252.1.5"}, {n2, pod3, "pod3 10.252.2.5"}, {n3, pod2, "pod2 10.252.3.5"}} {
		if got, err := testutil.Ask(c.from.pod, c.to); err != nil || got != c.want {
			t.Errorf("vxlan-direct: %s's pod -> %s: %q, %v", c.from.name, c.to, got, err)
		}
	}

	ext := testutil.EchoServer(t, w.router, "10.251.79.1:0", "ext")
	for _, n := range w.nodes {
		if got, err := testutil.Ask(n.pod, ext); err != nil || got != "ext "+n.ip {
			t.Errorf("vxlan-direct: %s's pod -> outside: %q, %v (want the node's address)", n.name, got, err)
		}
	}

	w.setBackend(t, backend.HostGW, w.nodes...)
	err := n1.reconcile(w.list())
	if err == nil || !strings.Contains(err.Error(), "10.251.79.13 is not on a directly connected network") {
		t.Errorf("host-gw to a node behind a router: %v", err)
	}
	k1 = n1.kernel(t)
	if !strings.Contains(k1, "no flatnet.1") || strings.Contains(k1, "10.252.3.0/24") ||
		strings.TrimSpace(strings.TrimPrefix(k1, "routes:\n")) != "10.252.2.0/24 via 10.251.78.12 dev eth0 \nno flatnet.1" {
		t.Errorf("n1 after the switch to host-gw:\n%q", k1)
	}
	if a := w.objs["n1"].Annotations; a[backend.AnnotationBackend] != "host-gw" || a[backend.AnnotationVTEPMAC] != "" {
		t.Errorf("n1's annotations after the switch: %v", a)
	}
	if got := readConflistMTU(t, n1.conf); got != 1500 {
		t.Errorf("host-gw conflist mtu %d, want 1500", got)
	}
	_ = n2.reconcile(w.list())
	if got, err := testutil.Ask(n1.pod, pod2); err != nil || got != "pod2 10.252.1.5" {
		t.Errorf("host-gw: pod1 -> pod2: %q, %v", got, err)
	}
	if _, err := os.Stat(n1.conf); err != nil {
		t.Error(err)
	}
}
