package nftables

import (
	"fmt"
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netpol"
)

// scaleModel is one node's share of issue 12's scale (500 pods and 1,000
// policies over 3 nodes): 170 local pods, each isolated both ways, each
// allowing 100 peer pods on two ports (ingress) and 20 peers (egress).
func scaleModel() []netpol.Pod {
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

// BenchmarkSync is the renderer's share of one change at scale: render
// every local pod (with the Renderer's memory, as the agent does) and
// write the difference from the previous ruleset (one pod lost or regained
// a peer). The kernel's commit comes on top (TestRootKernel logs
// it).
func BenchmarkSync(b *testing.B) {
	pods := scaleModel()
	rd := NewRenderer()
	last, err := rd.Render(pods)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(last.NumElements()), "elements")
	all, less := pods[0].Ingress.Allowed, pods[0].Ingress.Allowed[1:]
	for i := 0; b.Loop(); i++ {
		pods[0].Ingress.Allowed = [2][]netpol.Allow{less, all}[i%2]
		want, err := rd.Render(pods)
		if err != nil {
			b.Fatal(err)
		}
		tx := knftables.NewFake(knftables.InetFamily, testTable).NewTransaction()
		writeDiff(tx, last, want)
		if tx.NumOperations() != 1 {
			b.Fatalf("%d operations, want 1", tx.NumOperations())
		}
		last = want
	}
}
