package nftables

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/nft"
)

const testTable = "policy-test"

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

func np(ns, name string, d netpol.Direction, i int) netpol.RuleRef {
	return netpol.RuleRef{Kind: "NetworkPolicy", Policy: types.NamespacedName{Namespace: ns, Name: name}, Direction: d, Index: i}
}

func cnp(name string, d netpol.Direction, i int) netpol.RuleRef {
	return netpol.RuleRef{Kind: "ClusterNetworkPolicy", Policy: types.NamespacedName{Name: name}, Direction: d, Index: i}
}

func tcp(peer string, from, to uint16) netpol.Entry {
	return netpol.Entry{Peer: pfx(peer), Proto: netpol.ProtoTCP, From: from, To: to}
}

func anyProto(peer string) netpol.Entry {
	return netpol.Entry{Peer: pfx(peer), Proto: netpol.ProtoAny, From: 0, To: 65535}
}

func TestRenderLiteral(t *testing.T) {
	web := netpol.Pod{
		Pod: types.NamespacedName{Namespace: "x", Name: "web"},
		IPs: []netip.Addr{addr("10.0.1.5")},
		Ingress: netpol.Rules{
			Admin:    []netpol.TierRule{{Action: netpol.Deny, Entries: []netpol.Entry{anyProto("10.9.0.0/16")}, Rule: cnp("block", netpol.Ingress, 0), Priority: 10}},
			Isolated: true, Isolators: []netpol.RuleRef{np("x", "web", netpol.Ingress, -1)},
			Allowed: []netpol.Allow{
				{Entry: anyProto("10.0.0.0/16"), Rule: np("x", "web", netpol.Ingress, 0)},
				{Entry: tcp("10.0.2.7/32", 80, 81), Rule: np("x", "web", netpol.Ingress, 1)}, // inside the first: merged
				{Entry: tcp("10.1.0.0/24", 8080, 8080), Rule: np("x", "web", netpol.Ingress, 1)},
			},
		},
	}
	fake := nft.NewFake(knftables.InetFamily, testTable)
	syncWith(t, NewRenderer(), NewSyncer(fake), []netpol.Pod{web})
	want := `
add table inet policy-test { comment "flatnet network policy" ; }
add chain inet policy-test egress
add chain inet policy-test egress-np
add chain inet policy-test egress-tiers
add chain inet policy-test forward { type filter hook forward priority 0 ; }
add chain inet policy-test ingress
add chain inet policy-test ingress-np
add chain inet policy-test ingress-tiers
add set inet policy-test egress-allow-v4 { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; flags interval ; }
add set inet policy-test egress-allow-v6 { type ipv6_addr . ipv6_addr . inet_proto . inet_service ; flags interval ; }
add set inet policy-test egress-isolated-v4 { type ipv4_addr ; }
add set inet policy-test egress-isolated-v6 { type ipv6_addr ; }
add set inet policy-test egress-pods-v4 { type ipv4_addr ; }
add set inet policy-test egress-pods-v6 { type ipv6_addr ; }
add set inet policy-test ingress-admin-` + hash(cnp("block", netpol.Ingress, 0)) + `-v4 { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; flags interval ; }
add set inet policy-test ingress-allow-v4 { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; flags interval ; }
add set inet policy-test ingress-allow-v6 { type ipv6_addr . ipv6_addr . inet_proto . inet_service ; flags interval ; }
add set inet policy-test ingress-isolated-v4 { type ipv4_addr ; }
add set inet policy-test ingress-isolated-v6 { type ipv6_addr ; }
add set inet policy-test ingress-pods-v4 { type ipv4_addr ; }
add set inet policy-test ingress-pods-v6 { type ipv6_addr ; }
add counter inet policy-test ingress-admin-` + hash(cnp("block", netpol.Ingress, 0)) + ` { comment "ingress admin drops: block" ; }
add counter inet policy-test ingress-np-` + hashString("x/web") + ` { comment "ingress networkpolicy drops: x/web" ; }
add rule inet policy-test egress goto egress-tiers
add rule inet policy-test egress-np ip saddr . ip daddr . meta l4proto . th dport @egress-allow-v4 return
add rule inet policy-test egress-np ip6 saddr . ip6 daddr . meta l4proto . th dport @egress-allow-v6 return
add rule inet policy-test egress-np counter drop comment "NetworkPolicy: no rule allows it"
add rule inet policy-test egress-tiers ip saddr @egress-isolated-v4 goto egress-np
add rule inet policy-test egress-tiers ip6 saddr @egress-isolated-v6 goto egress-np
add rule inet policy-test forward ct state established,related accept
add rule inet policy-test forward ct state new tcp flags & (fin|syn|rst|ack) != syn ip daddr @egress-pods-v4 drop comment "a cut flow of a pod with egress rules, picked up the other way round"
add rule inet policy-test forward ct state new tcp flags & (fin|syn|rst|ack) != syn ip6 daddr @egress-pods-v6 drop comment "a cut flow of a pod with egress rules, picked up the other way round"
add rule inet policy-test forward ct state new tcp flags & (fin|syn|rst|ack) != syn ip saddr @ingress-pods-v4 drop comment "a cut flow of a pod with ingress rules, picked up the other way round"
add rule inet policy-test forward ct state new tcp flags & (fin|syn|rst|ack) != syn ip6 saddr @ingress-pods-v6 drop comment "a cut flow of a pod with ingress rules, picked up the other way round"
add rule inet policy-test forward ip saddr @egress-pods-v4 jump egress
add rule inet policy-test forward ip6 saddr @egress-pods-v6 jump egress
add rule inet policy-test forward ip daddr @ingress-pods-v4 jump ingress
add rule inet policy-test forward ip6 daddr @ingress-pods-v6 jump ingress
add rule inet policy-test ingress ip daddr . ip saddr . meta l4proto . th dport @ingress-admin-` + hash(cnp("block", netpol.Ingress, 0)) + `-v4 counter name "ingress-admin-` + hash(cnp("block", netpol.Ingress, 0)) + `" drop comment "Deny: ClusterNetworkPolicy block ingress rule 0"
add rule inet policy-test ingress goto ingress-tiers
add rule inet policy-test ingress-np ip daddr . ip saddr . meta l4proto . th dport @ingress-allow-v4 return
add rule inet policy-test ingress-np ip6 daddr . ip6 saddr . meta l4proto . th dport @ingress-allow-v6 return
add rule inet policy-test ingress-np ip daddr 10.0.1.5 counter name "ingress-np-` + hashString("x/web") + `" drop comment "x/web"
add rule inet policy-test ingress-np counter drop comment "NetworkPolicy: no rule allows it"
add rule inet policy-test ingress-tiers ip daddr @ingress-isolated-v4 goto ingress-np
add rule inet policy-test ingress-tiers ip6 daddr @ingress-isolated-v6 goto ingress-np
add element inet policy-test ingress-admin-` + hash(cnp("block", netpol.Ingress, 0)) + `-v4 { 10.0.1.5 . 10.9.0.0/16 . 0-255 . 0-65535 }
add element inet policy-test ingress-allow-v4 { 10.0.1.5 . 10.0.0.0/16 . 0-255 . 0-65535 }
add element inet policy-test ingress-allow-v4 { 10.0.1.5 . 10.1.0.0/24 . 6 . 8080 }
add element inet policy-test ingress-isolated-v4 { 10.0.1.5 }
add element inet policy-test ingress-pods-v4 { 10.0.1.5 }
`
	if diff := cmp.Diff(strings.TrimSpace(want), strings.TrimSpace(fake.Dump())); diff != "" {
		t.Errorf("ruleset (-want +got):\n%s", diff)
	}
}
