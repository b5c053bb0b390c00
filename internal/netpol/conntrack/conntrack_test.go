package conntrack

import (
	"net/netip"
	"testing"

	"github.com/flatnet/flatnet/internal/netpol"
)

var (
	a = netip.MustParseAddr
	p = netip.MustParsePrefix
)

// A pod that now admits only TCP/80 from 10.0.0.5 keeps that flow and
// loses the others; flows of pods without rules stay.
func TestCutDeletesOnlyDeniedFlows(t *testing.T) {
	pod := &netpol.Pod{IPs: []netip.Addr{a("10.0.1.2")}}
	pod.Ingress.Isolated = true
	pod.Ingress.Allowed = []netpol.Allow{{Entry: netpol.Entry{Peer: p("10.0.0.5/32"), Proto: netpol.ProtoTCP, From: 80, To: 80}}}
	egress := &netpol.Pod{IPs: []netip.Addr{a("10.0.1.3")}}
	egress.Egress.Isolated = true // default deny egress
	pods := Pods{a("10.0.1.2"): pod, a("10.0.1.3"): egress}

	keep := []Flow{
		{Src: a("10.0.0.5"), Dst: a("10.0.1.2"), Proto: netpol.ProtoTCP, Port: 80},  // allowed
		{Src: a("10.0.1.2"), Dst: a("10.0.0.9"), Proto: netpol.ProtoUDP, Port: 53},  // the pod's own egress: not isolated
		{Src: a("10.0.0.7"), Dst: a("10.0.0.8"), Proto: netpol.ProtoTCP, Port: 443}, // not a local pod
	}
	cut := []Flow{
		{Src: a("10.0.0.6"), Dst: a("10.0.1.2"), Proto: netpol.ProtoTCP, Port: 80},  // wrong peer
		{Src: a("10.0.0.5"), Dst: a("10.0.1.2"), Proto: netpol.ProtoUDP, Port: 80},  // wrong protocol
		{Src: a("10.0.1.3"), Dst: a("10.0.0.5"), Proto: netpol.ProtoTCP, Port: 443}, // egress denied
	}
	fake := NewFake(append(append([]Flow{}, keep...), cut...)...)
	n, err := Cut(fake, pods)
	if err != nil || n != len(cut) {
		t.Fatalf("Cut = %d, %v; want %d", n, err, len(cut))
	}
	if got := fake.Flows[false]; len(got) != len(keep) {
		t.Errorf("kept %v, want %v", got, keep)
	}
}
