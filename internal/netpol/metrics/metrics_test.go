package metrics

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/netpol/nftables"
)

type fakeCounters map[string]uint64

func (f fakeCounters) ListCounters(context.Context) ([]*knftables.Counter, error) {
	var out []*knftables.Counter
	for name, v := range f {
		out = append(out, &knftables.Counter{Name: name, Packets: knftables.PtrTo(v)})
	}
	return append(out, nil), nil // knftables' Fake returns nil entries too
}

func expect(t *testing.T, m *Metrics, want string) {
	t.Helper()
	head := `# HELP flatnet_networkpolicy_denied_packets_total Packets dropped by network policy, by direction, tier (admin, networkpolicy, baseline) and policy (namespace/name of a NetworkPolicy isolating the pod, or a ClusterNetworkPolicy with a Deny rule)
# TYPE flatnet_networkpolicy_denied_packets_total counter
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(head+want), "flatnet_networkpolicy_denied_packets_total"); err != nil {
		t.Error(err)
	}
}

// Drops are summed per policy (a pod isolated by two policies counts for
// both), survive a counter reset and a pod going away, and only grow.
func TestDeniedPackets(t *testing.T) {
	kernel := fakeCounters{"in-a": 5, "in-b": 2, "out-cnp": 7}
	m := New(kernel)
	m.SetCounters(map[string]nftables.Counter{
		"in-a":    {Direction: netpol.Ingress, Tier: "networkpolicy", Policies: []string{"x/deny", "x/web"}, Pod: "x/a"},
		"in-b":    {Direction: netpol.Ingress, Tier: "networkpolicy", Policies: []string{"x/deny"}, Pod: "x/b"},
		"out-cnp": {Direction: netpol.Egress, Tier: "admin", Policies: []string{"block"}},
	})
	expect(t, m, `flatnet_networkpolicy_denied_packets_total{direction="egress",policy="block",tier="admin"} 7
flatnet_networkpolicy_denied_packets_total{direction="ingress",policy="x/deny",tier="networkpolicy"} 7
flatnet_networkpolicy_denied_packets_total{direction="ingress",policy="x/web",tier="networkpolicy"} 5
`)
	// A full sync rebuilt the table: the kernel counts from 0 again.
	kernel["in-a"], kernel["in-b"] = 1, 2
	expect(t, m, `flatnet_networkpolicy_denied_packets_total{direction="egress",policy="block",tier="admin"} 7
flatnet_networkpolicy_denied_packets_total{direction="ingress",policy="x/deny",tier="networkpolicy"} 8
flatnet_networkpolicy_denied_packets_total{direction="ingress",policy="x/web",tier="networkpolicy"} 6
`)
	// Pod a is gone: its counter with it; its drops stay counted.
	delete(kernel, "in-a")
	m.SetCounters(map[string]nftables.Counter{
		"in-b":    {Direction: netpol.Ingress, Tier: "networkpolicy", Policies: []string{"x/deny"}, Pod: "x/b"},
		"out-cnp": {Direction: netpol.Egress, Tier: "admin", Policies: []string{"block"}},
	})
	kernel["in-b"] = 3
	expect(t, m, `flatnet_networkpolicy_denied_packets_total{direction="egress",policy="block",tier="admin"} 7
flatnet_networkpolicy_denied_packets_total{direction="ingress",policy="x/deny",tier="networkpolicy"} 9
flatnet_networkpolicy_denied_packets_total{direction="ingress",policy="x/web",tier="networkpolicy"} 6
`)
}
