// Package netpoltest holds models the renderers' tests and benchmarks
// share.
package netpoltest

import (
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/flatnet/flatnet/internal/netpol"
)

// Scale is one node's share of issue 12's scale (500 pods and 1,000
// policies over 3 nodes): 170 local pods (10.244.1.0-169), each isolated
// both ways, each allowing 100 peer pods on two ports (ingress) and 20
// peers (egress).
func Scale() []netpol.Pod {
	var pods []netpol.Pod
	for i := range 170 {
		p := netpol.Pod{Pod: types.NamespacedName{Namespace: fmt.Sprintf("ns%d", i%100), Name: fmt.Sprintf("p%d", i)},
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 1, byte(i)})}}
		p.Ingress.Isolated, p.Egress.Isolated = true, true
		for k := range 100 {
			peer := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(k % 3), byte((i + 7*k) % 250)}), 32)
			p.Ingress.Allowed = append(p.Ingress.Allowed, netpol.Allow{Entry: netpol.Entry{Peer: peer, Proto: netpol.ProtoTCP, From: 80, To: 81}})
			if k < 20 {
				p.Egress.Allowed = append(p.Egress.Allowed, netpol.Allow{Entry: netpol.Entry{Peer: peer, Proto: netpol.ProtoAny, To: 65535}})
			}
		}
		pods = append(pods, p)
	}
	return pods
}

// Allowed is the model's answer for a flow through one node: the source
// pod's egress, then the destination pod's ingress (a pod not among pods
// is not checked there). The renderers' tests compare their rules with it.
func Allowed(pods []netpol.Pod, src, dst netip.Addr, proto netpol.Protocol, port uint16) bool {
	for _, p := range pods {
		if slices.Contains(p.IPs, src) && !p.Egress.Check(dst, proto, port).Allowed {
			return false
		}
	}
	for _, p := range pods {
		if slices.Contains(p.IPs, dst) && !p.Ingress.Check(src, proto, port).Allowed {
			return false
		}
	}
	return true
}
