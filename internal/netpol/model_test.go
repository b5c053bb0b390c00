package netpol

import (
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func ref(name string, i int) RuleRef {
	return RuleRef{Kind: "ClusterNetworkPolicy", Policy: types.NamespacedName{Name: name}, Index: i}
}

// TestCheckTiers walks the three tiers: first match in Admin, then the
// NetworkPolicy union, then Baseline, then allow.
func TestCheckTiers(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	np := RuleRef{Kind: "NetworkPolicy", Policy: types.NamespacedName{Namespace: "x", Name: "np"}, Index: 0}
	r := Rules{
		Admin: []TierRule{
			{Action: Pass, Entries: []Entry{{Peer: p("10.0.0.0/24"), Proto: ProtoTCP, From: 80, To: 80}}, Rule: ref("pass", 0)},
			{Action: Deny, Entries: []Entry{{Peer: p("10.0.0.0/16"), Proto: ProtoTCP, From: 80, To: 81}}, Rule: ref("deny", 0)},
			{Action: Accept, Entries: []Entry{{Peer: p("10.1.0.0/16"), Proto: ProtoAny, From: 0, To: 65535}}, Rule: ref("accept", 0)},
		},
		Isolated:  true,
		Isolators: []RuleRef{np},
		Allowed:   []Allow{{Entry: Entry{Peer: p("10.0.0.5/32"), Proto: ProtoTCP, From: 80, To: 80}, Rule: np}},
		Baseline:  []TierRule{{Action: Deny, Entries: []Entry{{Peer: p("0.0.0.0/0"), Proto: ProtoAny, To: 65535}}, Rule: ref("base", 0)}},
	}
	for _, tc := range []struct {
		peer  string
		proto Protocol
		port  uint16
		want  bool
		tier  string
	}{
		{"10.0.0.5", ProtoTCP, 80, true, "networkpolicy"},  // Pass, then the NP allows
		{"10.0.0.6", ProtoTCP, 80, false, "networkpolicy"}, // Pass, the NP isolates
		{"10.0.1.5", ProtoTCP, 81, false, "admin"},         // Deny
		{"10.0.1.5", ProtoTCP, 82, false, "networkpolicy"}, // no admin match, isolated
		{"10.1.2.3", ProtoUDP, 53, true, "admin"},          // Accept skips the NP
	} {
		d := r.Check(a(tc.peer), tc.proto, tc.port)
		if d.Allowed != tc.want || d.Tier != tc.tier {
			t.Errorf("%s %s/%d: got %v, want allowed=%v tier %s", tc.peer, tc.proto, tc.port, d, tc.want, tc.tier)
		}
	}
	r.Isolated = false
	if d := r.Check(a("10.0.0.6"), ProtoTCP, 80); d.Allowed || d.Tier != "baseline" {
		t.Errorf("not isolated: got %v, want the baseline deny", d)
	}
	r.Baseline = nil
	if d := r.Check(a("10.0.0.6"), ProtoTCP, 80); !d.Allowed || d.Tier != "" {
		t.Errorf("nothing applies: got %v, want allowed", d)
	}
}
