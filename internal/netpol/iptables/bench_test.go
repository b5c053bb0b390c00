package iptables

import (
	"testing"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netpol"
)

// BenchmarkSync is the renderer's share of one change at scale: render
// every local pod and write the restore input for what changed (one pod
// lost or regained a peer: its chain). The kernel's restore comes on top
// (TestRootScale logs it).
func BenchmarkSync(b *testing.B) {
	pods := scaleModel()
	last := Render(pods)
	all, less := pods[0].Ingress.Allowed, pods[0].Ingress.Allowed[1:]
	for i := 0; b.Loop(); i++ {
		pods[0].Ingress.Allowed = [2][]netpol.Allow{less, all}[i%2]
		want := Render(pods)
		w := writeDiff(last.Families[ipt.IPv4], want.Families[ipt.IPv4])
		if w.lines() != 1+len(want.Families[ipt.IPv4][podChain(directions[1], pods[0].Pod.String(), "")]) {
			b.Fatalf("%d lines, want one chain's", w.lines())
		}
		_ = w.bytes()
		last = want
	}
	b.ReportMetric(float64(last.NumRules()), "rules")
}
