package nftables

import (
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/netpol/netpoltest"
)

// BenchmarkSync is the renderer's share of one change at scale: render
// every local pod (with the Renderer's memory, as the agent does) and
// write the difference from the previous ruleset (one pod lost or regained
// a peer). The kernel's commit comes on top (TestRootKernel logs
// it).
func BenchmarkSync(b *testing.B) {
	pods := netpoltest.Scale()
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
