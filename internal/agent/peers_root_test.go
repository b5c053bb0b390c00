package agent

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootPeer: Reconciler.Peer on the real kernel (netlink batches with
// Add, Replace and Delete of routes, neighbour and FDB entries): after
// each peer change the kernel is what a full reconcile leaves, and a
// route flatnet does not own is refused, not taken over.
func TestRootPeer(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireFreeRange(t, scaleUnderlay, scalePods)
	for _, be := range []string{backend.HostGW, backend.VXLAN} {
		t.Run(be, func(t *testing.T) {
			ns := testutil.NewNetNS(t)
			nsn := testutil.NSName(ns)
			testutil.Run(t, "ip", "-n", nsn, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
			testutil.Run(t, "ip", "-n", nsn, "addr", "add", "10.249.0.1/16", "dev", "eth0")
			testutil.Run(t, "ip", "-n", nsn, "link", "set", "eth0", "up")
			testutil.Run(t, "ip", "-n", nsn, "link", "set", "eth0p", "up")
			bk, err := backend.New(be, backend.Config{VNI: 1, Port: 4789, TxChecksumOffload: true})
			if err != nil {
				t.Fatal(err)
			}
			r := &Reconciler{
				NodeName:     "n0",
				ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(scalePods)},
				CNIConfDir:   filepath.Join(t.TempDir(), "net.d"),
				Backend:      bk,
				Kernel:       backend.Kernel{Routes: &routes.Netlink{}, VXLAN: vxlan.Netlink{}},
			}
			ctx := context.Background()
			nodes := scalePeers(5, netip.MustParsePrefix(scaleUnderlay), netip.MustParsePrefix(scalePods))
			in := func(fn func() error) error { return netns.Do(ns, fn) }
			dump := func() string {
				s := flatnetRoutes(t, nsn)
				if be == backend.VXLAN {
					s += testutil.Run(t, "ip", "-n", nsn, "neigh", "show", "dev", vxlan.DeviceName, "nud", "permanent")
					s += testutil.Run(t, "bridge", "-n", nsn, "fdb", "show", "dev", vxlan.DeviceName, "self", "permanent")
				}
				return s
			}
			if err := in(func() error { return r.Reconcile(ctx, nodes[:4]) }); err != nil {
				t.Fatal(err)
			}
			step := func(what string, n *corev1.Node, list []*corev1.Node, has, hasNot string) {
				t.Helper()
				name := "n4"
				if err := in(func() error { return r.Peer(ctx, name, n) }); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				got := dump()
				if !strings.Contains(got, has) || (hasNot != "" && strings.Contains(got, hasNot)) {
					t.Errorf("%s: kernel has\n%swant %q, not %q", what, got, has, hasNot)
				}
				if err := in(func() error { return r.Reconcile(ctx, list) }); err != nil {
					t.Fatal(err)
				}
				if full := dump(); full != got {
					t.Errorf("%s: after Peer\n%safter a full reconcile\n%s", what, got, full)
				}
			}
			n4 := nodes[4]
			step("add n4", n4, nodes, "10.160.4.0/24 via", "")
			moved := movePeer(n4, netip.MustParseAddr("10.249.0.55"))
			step("move n4", moved, append(nodes[:4:4], moved), "10.249.0.55", "10.249.0.5 ")
			resub := moved.DeepCopy()
			resub.Spec.PodCIDR, resub.Spec.PodCIDRs = "10.160.44.0/24", []string{"10.160.44.0/24"}
			step("new podCIDR for n4", resub, append(nodes[:4:4], resub), "10.160.44.0/24 via", "10.160.4.0")
			step("delete n4", nil, nodes[:4], "10.160.3.0/24 via", "10.160.44.0")

			// A route flatnet does not own to n4's subnet: refused.
			testutil.Run(t, "ip", "-n", nsn, "route", "add", "10.160.4.0/24", "via", "10.249.0.99")
			if err := in(func() error { return r.Peer(ctx, "n4", n4) }); err == nil || !strings.Contains(err.Error(), "file exists") {
				t.Errorf("n4 onto a foreign route: %v, want EEXIST", err)
			}
			if got := testutil.Run(t, "ip", "-n", nsn, "route", "show", "10.160.4.0/24"); !strings.Contains(got, "via 10.249.0.99") || strings.Contains(got, "0x66") {
				t.Errorf("foreign route taken over: %s", got)
			}
		})
	}
}
