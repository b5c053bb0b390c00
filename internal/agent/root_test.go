package agent

import (
	"context"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/masq"
	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// rootNode is one simulated node: a namespace on the underlay with a cni0
// bridge holding the gateway of its pod subnet, and one pod namespace
// behind it.
type rootNode struct {
	name, ns, pod string
	r             *Reconciler
}

const (
	underlay = "10.251.77.0/24"
	cluster  = "10.252.0.0/16"
)

// newRootCluster builds two nodes on a veth underlay: node i has
// InternalIP 10.251.77.1i, pod subnet 10.252.i.0/24 and a pod 10.252.i.5.
func newRootCluster(t *testing.T) []*rootNode {
	testutil.RequireRoot(t)
	testutil.RequireFreeRange(t, underlay, cluster)
	hostGW, _ := backend.New(backend.HostGW, backend.Config{})
	var nodes []*rootNode
	for i := 1; i <= 2; i++ {
		n := &rootNode{name: "n" + string(rune('0'+i)), ns: testutil.NewNetNS(t), pod: testutil.NewNetNS(t)}
		nsn := testutil.NSName(n.ns)
		sub := "10.252." + string(rune('0'+i))
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
		n.r = &Reconciler{
			NodeName:     n.name,
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(cluster)},
			CNIConfDir:   filepath.Join(t.TempDir(), "net.d"),
			Backend:      hostGW,
			Kernel:       backend.Kernel{Routes: &routes.Netlink{}, VXLAN: vxlan.Netlink{}},
			Masq:         m,
			Masquerade:   true,
		}
		nodes = append(nodes, n)
	}
	testutil.Wire(t, nodes[0].ns, "eth0", []string{"10.251.77.11/24"}, nodes[1].ns, "eth0", []string{"10.251.77.12/24"})
	return nodes
}

func (n *rootNode) reconcile(t *testing.T, nodes []*corev1.Node) {
	t.Helper()
	err := netns.Do(n.ns, func() error { return n.r.Reconcile(context.Background(), nodes) })
	if err != nil {
		t.Fatalf("reconcile on %s: %v", n.name, err)
	}
}

// state is what the agent owns in n's kernel: its routes, its nft table
// and ip_forward.
func (n *rootNode) state(t *testing.T) string {
	t.Helper()
	nsn := testutil.NSName(n.ns)
	var fwd string
	netns.Do(n.ns, func() error {
		fwd, _ = sysctl.Get("net.ipv4.ip_forward")
		return nil
	})
	return "routes:\n" + flatnetRoutes(t, nsn) +
		"nft:\n" + testutil.Run(t, "ip", "netns", "exec", nsn, "nft", "list", "table", "inet", masq.Table) +
		"ip_forward=" + fwd
}

func TestRootHostGWAndMasquerade(t *testing.T) {
	c := newRootCluster(t)
	n1, n2 := c[0], c[1]
	nodes := []*corev1.Node{k8sNode("n1", "10.252.1.0/24", "10.251.77.11"), k8sNode("n2", "10.252.2.0/24", "10.251.77.12")}
	for _, n := range c {
		n.reconcile(t, nodes)
	}
	if got := flatnetRoutes(t, testutil.NSName(n1.ns)); strings.TrimSpace(got) != "10.252.2.0/24 via 10.251.77.12 dev eth0" {
		t.Errorf("n1 routes: %q", got)
	}
	if got := testutil.Run(t, "ip", "-n", testutil.NSName(n1.ns), "route", "show", "proto", "0x66"); !strings.Contains(got, " nhid ") {
		t.Errorf("n1's route is not through a nexthop object: %q", got)
	}
	st := n1.state(t)
	if !strings.HasSuffix(st, "ip_forward=1") || !strings.Contains(st, "masquerade") {
		t.Errorf("n1 state:\n%s", st)
	}

	// Pod to pod across nodes: delivered, with the client's own IP.
	pod2 := testutil.EchoServer(t, n2.pod, "10.252.2.5:0", "pod2")
	if got, err := testutil.Ask(n1.pod, pod2); err != nil || got != "pod2 10.252.1.5" {
		t.Fatalf("pod1 -> pod2: %q, %v (want the pod's own IP: no NAT between pods)", got, err)
	}
	pod1 := testutil.EchoServer(t, n1.pod, "10.252.1.5:0", "pod1")
	if got, err := testutil.Ask(n2.pod, pod1); err != nil || got != "pod1 10.252.2.5" {
		t.Fatalf("pod2 -> pod1: %q, %v", got, err)
	}
	// Node to a remote pod.
	if got, err := testutil.Ask(n1.ns, pod2); err != nil || got != "pod2 10.251.77.11" {
		t.Fatalf("node1 -> pod2: %q, %v", got, err)
	}
	// Pod to a destination outside the cluster CIDR (the other node's
	// underlay address): masqueraded to node1's address.
	node2 := testutil.EchoServer(t, n2.ns, "10.251.77.12:0", "node2")
	if got, err := testutil.Ask(n1.pod, node2); err != nil || got != "node2 10.251.77.11" {
		t.Fatalf("pod1 -> node2: %q, %v (want the masqueraded node address)", got, err)
	}

	// Idempotent: reconciling again leaves the kernel state as it was.
	before := n1.state(t)
	n1.reconcile(t, nodes)
	if after := n1.state(t); after != before {
		t.Errorf("second reconcile changed the state:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// n2 moves to another InternalIP: n1's route follows.
	testutil.Run(t, "ip", "-n", testutil.NSName(n2.ns), "addr", "add", "10.251.77.22/24", "dev", "eth0")
	moved := []*corev1.Node{nodes[0], k8sNode("n2", "10.252.2.0/24", "10.251.77.22")}
	n1.reconcile(t, moved)
	if got := flatnetRoutes(t, testutil.NSName(n1.ns)); strings.TrimSpace(got) != "10.252.2.0/24 via 10.251.77.22 dev eth0" {
		t.Errorf("n1 routes after n2 moved: %q", got)
	}
	if got, err := testutil.Ask(n1.pod, pod2); err != nil || got != "pod2 10.252.1.5" {
		t.Fatalf("pod1 -> pod2 after n2 moved: %q, %v", got, err)
	}

	// n2 leaves the cluster: its route goes, and pod2 is unreachable.
	n1.reconcile(t, moved[:1])
	if got := flatnetRoutes(t, testutil.NSName(n1.ns)); got != "" {
		t.Errorf("n1 routes after n2 left: %q", got)
	}
	if got, err := testutil.Ask(n1.pod, pod2); err == nil {
		t.Errorf("pod2 still reachable after its node left: %q", got)
	}
}

func TestRootForeignRouteIsNotTaken(t *testing.T) {
	c := newRootCluster(t)
	n1 := c[0]
	// An administrator's own route to n2's subnet: the agent must leave it.
	nsn := testutil.NSName(n1.ns)
	testutil.Run(t, "ip", "-n", nsn, "route", "add", "10.252.2.0/24", "via", "10.251.77.99")
	nodes := []*corev1.Node{k8sNode("n1", "10.252.1.0/24", "10.251.77.11"), k8sNode("n2", "10.252.2.0/24", "10.251.77.12")}
	err := netns.Do(n1.ns, func() error { return n1.r.Reconcile(context.Background(), nodes) })
	if err == nil || !strings.Contains(err.Error(), "does not own") {
		t.Fatalf("reconcile: %v", err)
	}
	if got := testutil.Run(t, "ip", "-n", nsn, "route", "show", "10.252.2.0/24"); !strings.Contains(got, "via 10.251.77.99") {
		t.Errorf("the foreign route changed: %q", got)
	}
}

var nhidRE = regexp.MustCompile(`nhid (\d+) `)

// flatnetRoutes is `ip route show proto 0x66` in the namespace nsn, each
// route's "nhid N " taken out: the ID is the agent's bookkeeping, the
// gateway and device (which ip shows beside it) what the route does. It
// fails t when a nexthop of flatnet's is left that no route goes through.
func flatnetRoutes(t testing.TB, nsn string) string {
	t.Helper()
	rs := testutil.Run(t, "ip", "-n", nsn, "route", "show", "proto", "0x66")
	used := map[string]bool{}
	for _, m := range nhidRE.FindAllStringSubmatch(rs, -1) {
		used[m[1]] = true
	}
	for _, line := range strings.Split(testutil.Run(t, "ip", "-n", nsn, "nexthop", "show", "proto", "0x66"), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "id" && !used[f[1]] {
			t.Errorf("in %s, nexthop %q is left without a route", nsn, line)
		}
	}
	return nhidRE.ReplaceAllString(rs, "")
}
