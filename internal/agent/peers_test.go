package agent

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
)

// vxlanNode is k8sNode with the annotations a vxlan agent publishes.
func vxlanNode(name, podCIDR, ip string) *corev1.Node {
	n := k8sNode(name, podCIDR, ip)
	n.Annotations = map[string]string{
		backend.AnnotationBackend:  backend.VXLAN,
		backend.AnnotationVTEPMAC:  vxlan.MACFor(name).String(),
		backend.AnnotationPublicIP: ip,
	}
	return n
}

// kernelDump is f's routes and VXLAN device, entries included.
func (f *fakeNode) kernelDump() string { return f.routes.Dump() + f.vxlan.Dump(vxlan.DeviceName) }

// kernelOps counts the changes f's kernel has seen.
func (f *fakeNode) kernelOps() int { return f.routes.Ops + len(f.vxlan.Ops) }

// TestPeerIncremental: a peer added, changed and deleted changes exactly
// that peer's entries (counted on the fake kernel), and leaves the kernel
// as a full reconcile of the same Node list does; what Peer cannot do
// alone (this node's change, a contested subnet, a route it does not own)
// it hands to a full reconcile; a drifted entry is repaired by the
// periodic full reconcile, not by a peer event.
func TestPeerIncremental(t *testing.T) {
	for _, tc := range []struct {
		backend string
		// ops per step: add a peer, move it (new InternalIP), new podCIDR,
		// delete it.
		add, move, resubnet, del int
	}{
		{backend.HostGW, 1, 1, 2, 1},
		{backend.VXLAN, 3, 1, 4, 3}, // route+neigh+fdb; fdb; route add+del, neigh set+del
	} {
		t.Run(tc.backend, func(t *testing.T) {
			ctx := context.Background()
			mk := func(be string) *fakeNode { return newFakeNodeWith(t, "n1", be, backend.Config{VNI: 1, Port: 4789}) }
			f := mk(tc.backend)
			nodes := map[string]*corev1.Node{}
			for _, n := range []*corev1.Node{
				vxlanNode("n1", "10.244.1.0/24", "10.250.0.11"),
				vxlanNode("n2", "10.244.2.0/24", "10.250.0.12"),
				vxlanNode("n3", "10.244.3.0/24", "10.250.0.13"),
			} {
				nodes[n.Name] = n
			}
			list := func() []*corev1.Node {
				var out []*corev1.Node
				for _, n := range nodes {
					out = append(out, n)
				}
				return out
			}
			if err := f.r.Reconcile(ctx, list()); err != nil {
				t.Fatal(err)
			}
			// step applies one Node change through Peer: it must write
			// want kernel changes and end where a full reconcile does.
			step := func(what, name string, n *corev1.Node, want int) {
				t.Helper()
				if n == nil {
					delete(nodes, name)
				} else {
					nodes[name] = n
				}
				ops := f.kernelOps()
				if err := f.r.Peer(ctx, name, n); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if got := f.kernelOps() - ops; got != want {
					t.Errorf("%s: %d kernel changes, want %d", what, got, want)
				}
				full := mk(tc.backend)
				if err := full.r.Reconcile(ctx, list()); err != nil {
					t.Fatal(err)
				}
				if got, want := f.kernelDump(), full.kernelDump(); got != want {
					t.Errorf("%s: kernel\n%s\nfull reconcile gives\n%s", what, got, want)
				}
			}
			step("add n4", "n4", vxlanNode("n4", "10.244.4.0/24", "10.250.0.14"), tc.add)
			moved := vxlanNode("n4", "10.244.4.0/24", "10.250.0.24")
			step("move n4", "n4", moved, tc.move)
			step("same n4 again", "n4", moved, 0)
			step("new podCIDR for n4", "n4", vxlanNode("n4", "10.244.40.0/24", "10.250.0.24"), tc.resubnet)
			step("delete n4", "n4", nil, tc.del)
			step("delete n4 again", "n4", nil, 0)

			// This node's own change, and a subnet another peer holds, need
			// the full computation.
			if err := f.r.Peer(ctx, "n1", nodes["n1"]); !errors.Is(err, errNeedFull) {
				t.Errorf("own change: %v, want errNeedFull", err)
			}
			ops := f.kernelOps()
			if err := f.r.Peer(ctx, "n5", vxlanNode("n5", "10.244.2.0/24", "10.250.0.15")); !errors.Is(err, errNeedFull) {
				t.Errorf("n5 taking n2's subnet: %v, want errNeedFull", err)
			}
			if f.kernelOps() != ops {
				t.Errorf("a contested change wrote to the kernel")
			}
			if err := f.r.Peer(ctx, "n6", vxlanNode("n6", "10.244.6.0/24", "10.250.0.16")); !errors.Is(err, errNeedFull) {
				t.Errorf("after a hand-over the index is stale: %v, want errNeedFull", err)
			}
			if err := f.r.Reconcile(ctx, list()); err != nil {
				t.Fatal(err)
			}

			// A route to the new peer's subnet that flatnet does not own is
			// not taken over: Peer fails, the index is dropped.
			f.routes.Foreign = append(f.routes.Foreign, netip.MustParsePrefix("10.244.7.0/24"))
			if err := f.r.Peer(ctx, "n7", vxlanNode("n7", "10.244.7.0/24", "10.250.0.17")); err == nil || errors.Is(err, errNeedFull) {
				t.Errorf("n7 onto a foreign route: %v, want a kernel error", err)
			}
			if err := f.r.Peer(ctx, "n2", nodes["n2"]); !errors.Is(err, errNeedFull) {
				t.Errorf("after a failed write: %v, want errNeedFull", err)
			}
			f.routes.Foreign = nil
			if err := f.r.Reconcile(ctx, list()); err != nil {
				t.Fatal(err)
			}

			// Drift: n2's route vanishes. A peer event for n3 leaves it
			// alone; the periodic full reconcile puts it back.
			n2dst := netip.MustParsePrefix("10.244.2.0/24")
			delete(f.routes.Owned, n2dst)
			nodes["n3"] = vxlanNode("n3", "10.244.3.0/24", "10.250.0.33")
			ops = f.kernelOps()
			if err := f.r.Peer(ctx, "n3", nodes["n3"]); err != nil {
				t.Fatal(err)
			}
			if got := f.kernelOps() - ops; got != tc.move {
				t.Errorf("move n3: %d kernel changes, want %d", got, tc.move)
			}
			if _, ok := f.routes.Owned[n2dst]; ok {
				t.Error("a peer event for n3 restored n2's route")
			}
			if err := f.r.Reconcile(ctx, list()); err != nil {
				t.Fatal(err)
			}
			full := mk(tc.backend)
			if err := full.r.Reconcile(ctx, list()); err != nil {
				t.Fatal(err)
			}
			if got, want := f.kernelDump(), full.kernelDump(); got != want {
				t.Errorf("drift not repaired: kernel\n%s\nwant\n%s", got, want)
			}
		})
	}
}
