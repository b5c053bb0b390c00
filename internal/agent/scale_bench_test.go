package agent

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
)

// scalePeers are self ("n0") and n-1 peers: node i has InternalIP
// <underlay>+i and pod subnet <pods>+i*256 as a /24, and the annotations a
// vxlan agent publishes.
func scalePeers(n int, under, pods netip.Prefix) []*corev1.Node {
	out := make([]*corev1.Node, 0, n)
	for i := range n {
		name := fmt.Sprintf("n%d", i)
		ip := addrAdd(under.Addr(), uint32(i+1))
		sub := netip.PrefixFrom(addrAdd(pods.Addr(), uint32(i)*256), 24)
		node := k8sNode(name, sub.String(), ip.String())
		node.Annotations = map[string]string{
			backend.AnnotationBackend:  backend.VXLAN,
			backend.AnnotationVTEPMAC:  vxlan.MACFor(name).String(),
			backend.AnnotationPublicIP: ip.String(),
		}
		out = append(out, node)
	}
	return out
}

func addrAdd(a netip.Addr, n uint32) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + n
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// movePeer gives node a new InternalIP and public-ip annotation (ip+off),
// as a peer re-registering elsewhere: its route (host-gw) or FDB entry
// (vxlan) changes.
func movePeer(n *corev1.Node, ip netip.Addr) *corev1.Node {
	c := n.DeepCopy()
	for i, a := range c.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			c.Status.Addresses[i].Address = ip.String()
		}
	}
	c.Annotations[backend.AnnotationPublicIP] = ip.String()
	return c
}

// BenchmarkPeerEvent: the CPU one peer's change costs a node that has
// 4,999 peers, against the fake kernel (no root). Each op moves one peer
// to a new address; kernelOps/op counts the fake kernel's changes. "peer"
// is the agent's path (Reconciler.Peer), "full" a full Reconcile of all
// Nodes (the agent's path before issue 16, and its periodic resync).
func BenchmarkPeerEvent(b *testing.B) {
	for _, be := range []string{backend.HostGW, backend.VXLAN} {
		for _, path := range []string{"peer", "full"} {
			b.Run(be+"/"+path, func(b *testing.B) {
				f := newFakeNodeWith(&testing.T{}, "n0", be, backend.Config{VNI: 1, Port: 4789})
				f.r.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.160.0.0/11")}
				nodes := scalePeers(5000, netip.MustParsePrefix("10.250.0.0/16"), netip.MustParsePrefix("10.160.0.0/11"))
				ctx := klog.NewContext(context.Background(), logr.Discard())
				if err := f.r.Reconcile(ctx, nodes); err != nil {
					b.Fatal(err)
				}
				ops0 := f.routes.Ops + len(f.vxlan.Ops)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					k := 1 + i%(len(nodes)-1)
					ip := addrAdd(netip.MustParseAddr("10.250.100.0"), uint32(i%2*20000+k))
					nodes[k] = movePeer(nodes[k], ip)
					var err error
					if path == "peer" {
						err = f.r.Peer(ctx, nodes[k].Name, nodes[k])
					} else {
						err = f.r.Reconcile(ctx, nodes)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(f.routes.Ops+len(f.vxlan.Ops)-ops0)/float64(b.N), "kernelOps/op")
			})
		}
	}
}
