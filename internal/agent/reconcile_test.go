package agent

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/agent/masq"
	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/subnet"
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

type countingNFT struct {
	*nft.Fake
	runs int
}

func (c *countingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if tx.NumOperations() > 0 {
		c.runs++
	}
	return c.Fake.Run(ctx, tx)
}

type fakeNode struct {
	r      *Reconciler
	routes *routes.Fake
	nft    *countingNFT
	sysctl map[string]string
	conf   string
}

func newFakeNode(t *testing.T, name string) *fakeNode {
	f := &fakeNode{routes: routes.NewFake(), nft: &countingNFT{Fake: nft.NewFake(knftables.InetFamily, masq.Table)}, sysctl: map[string]string{}}
	dir := filepath.Join(t.TempDir(), "net.d")
	f.conf = filepath.Join(dir, subnet.FileName)
	f.r = &Reconciler{
		NodeName:     name,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		CNIConfDir:   dir,
		CNIDataDir:   "/data",
		Routes:       f.routes,
		Masq:         masq.New(f.nft),
		Masquerade:   true,
		Sysctl:       func(k, v string) error { f.sysctl[k] = v; return nil },
	}
	return f
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
	want, _ := subnet.Render(subnet.Config{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, DataDir: "/data"})
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("conflist (-want +got):\n%s", d)
	}
	if f.routes.Dump() != "10.244.2.0/24 via 10.250.0.12\n10.244.3.0/24 via 10.250.0.13\n" {
		t.Errorf("routes:\n%s", f.routes.Dump())
	}

	// Idempotent: nothing is rewritten.
	st1, _ := os.Stat(f.conf)
	f.routes.Ops, f.nft.runs = 0, 0
	dump := f.nft.Dump()
	if err := f.r.Reconcile(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	st2, _ := os.Stat(f.conf)
	if f.routes.Ops != 0 || f.nft.runs != 0 || !os.SameFile(st1, st2) || f.nft.Dump() != dump {
		t.Errorf("second reconcile changed things: %d route ops, %d nft runs, same conflist file %v", f.routes.Ops, f.nft.runs, os.SameFile(st1, st2))
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

func TestValidate(t *testing.T) {
	ok := Options{NodeName: "n", ClusterCIDR: "10.244.0.0/16", Backend: "host-gw", CNIConfDir: "/x", Resync: 1}
	if _, err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Options){
		"node name":  func(o *Options) { o.NodeName = "" },
		"cidr":       func(o *Options) { o.ClusterCIDR = "10.244.0.1/16" },
		"backend":    func(o *Options) { o.Backend = "vxlan" },
		"lab ip":     func(o *Options) { o.LabRuntime, o.RuntimeStateDir = true, "/s" },
		"lab state":  func(o *Options) { o.LabRuntime, o.NodeIP = true, "10.0.0.1" },
		"resync":     func(o *Options) { o.Resync = 0 },
		"cni conf":   func(o *Options) { o.CNIConfDir = "" },
		"cidr empty": func(o *Options) { o.ClusterCIDR = "" },
	} {
		o := ok
		mut(&o)
		if _, err := o.validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	o := ok
	o.ClusterCIDR = "10.244.0.0/16, fd00:10:244::/56"
	if c, err := o.validate(); err != nil || len(c) != 2 {
		t.Errorf("dual-stack: %v %v", c, err)
	}
}
