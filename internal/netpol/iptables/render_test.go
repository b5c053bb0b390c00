package iptables

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netpol"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

func np(ns, name string, d netpol.Direction, i int) netpol.RuleRef {
	return netpol.RuleRef{Kind: "NetworkPolicy", Policy: types.NamespacedName{Namespace: ns, Name: name}, Direction: d, Index: i}
}

func cnp(name string, d netpol.Direction, i int) netpol.RuleRef {
	return netpol.RuleRef{Kind: "ClusterNetworkPolicy", Policy: types.NamespacedName{Name: name}, Direction: d, Index: i}
}

func entry(peer string, proto netpol.Protocol, from, to uint16) netpol.Entry {
	return netpol.Entry{Peer: pfx(peer), Proto: proto, From: from, To: to}
}

func anyProto(peer string) netpol.Entry { return entry(peer, netpol.ProtoAny, 0, 65535) }

// dump is the fake's filter table as "-A chain args" lines (and ":chain"
// for each chain of ours), pod chains named <direction/pod>.
func dump(t *testing.T, f *ipt.Fake, proto ipt.Protocol, pods ...string) string {
	t.Helper()
	tb, err := f.Save(context.Background(), proto, Table)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, c := range tb.Chains {
		if Ours(c) {
			lines = append(lines, ":"+c)
		}
	}
	for _, r := range tb.Rules {
		lines = append(lines, "-A "+r.Chain+" "+strings.Join(r.Args, " "))
	}
	d := strings.Join(lines, "\n")
	for _, p := range pods {
		for _, dir := range directions {
			for _, suffix := range []string{"", "T"} {
				d = strings.ReplaceAll(d, podChain(dir, p, suffix), "<"+dir.tag+suffix+" "+p+">")
			}
		}
	}
	return d
}

func literalModel() []netpol.Pod {
	a := netpol.Pod{
		Pod: types.NamespacedName{Namespace: "x", Name: "a"},
		IPs: []netip.Addr{addr("10.244.1.5"), addr("fd00::5")},
		Ingress: netpol.Rules{
			Admin: []netpol.TierRule{
				{Action: netpol.Deny, Entries: []netpol.Entry{anyProto("10.244.9.0/24"), entry("10.244.9.7/32", netpol.ProtoTCP, 80, 80)}, Rule: cnp("deny", netpol.Ingress, 0)},
				{Action: netpol.Pass, Entries: []netpol.Entry{anyProto("10.244.8.0/24"), anyProto("fd00:9::/64")}, Rule: cnp("pass", netpol.Ingress, 0)},
				{Action: netpol.Accept, Entries: []netpol.Entry{anyProto("10.244.9.0/24")}, Rule: cnp("shadowed", netpol.Ingress, 0)},
			},
			Isolated:  true,
			Isolators: []netpol.RuleRef{np("x", "web", netpol.Ingress, -1)},
			Allowed: []netpol.Allow{
				{Entry: entry("10.244.2.0/24", netpol.ProtoTCP, 80, 81)},
				{Entry: entry("0.0.0.0/0", netpol.ProtoSCTP, 443, 443)},
				{Entry: entry("10.244.2.0/24", netpol.ProtoTCP, 80, 81)},
				{Entry: entry("fd00::/48", netpol.ProtoUDP, 0, 65535)},
			},
			Baseline: []netpol.TierRule{{Action: netpol.Deny, Entries: []netpol.Entry{anyProto("0.0.0.0/0")}, Rule: cnp("base", netpol.Ingress, 0)}},
		},
		Egress: netpol.Rules{Isolated: true, Isolators: []netpol.RuleRef{np("x", "dns", netpol.Egress, -1)},
			Allowed: []netpol.Allow{{Entry: entry("10.96.0.10/32", netpol.ProtoUDP, 53, 53)}}},
	}
	b := netpol.Pod{
		Pod: types.NamespacedName{Namespace: "x", Name: "b"},
		IPs: []netip.Addr{addr("10.244.1.6")},
		Ingress: netpol.Rules{
			Admin:    []netpol.TierRule{{Action: netpol.Accept, Entries: []netpol.Entry{entry("10.244.3.0/24", netpol.ProtoTCP, 8080, 8090)}, Rule: cnp("first", netpol.Ingress, 0)}},
			Baseline: []netpol.TierRule{{Action: netpol.Deny, Entries: []netpol.Entry{anyProto("10.0.0.0/8")}, Rule: cnp("base", netpol.Ingress, 0)}},
		},
	}
	// No rules: no chain, no jump.
	c := netpol.Pod{Pod: types.NamespacedName{Namespace: "x", Name: "c"}, IPs: []netip.Addr{addr("10.244.1.7")}}
	return []netpol.Pod{b, a, c}
}

// TestSyncLiteral: the rules of a small model, written next to a rule of
// someone else's in FORWARD (left alone, our jump before it); syncing
// again changes nothing; a full sync rewrites the same; Cleanup leaves
// only the other rule.
func TestSyncLiteral(t *testing.T) {
	ctx := context.Background()
	f := ipt.NewFake()
	if err := f.Restore(ctx, ipt.IPv4, []byte("*filter\n-A FORWARD -s 10.244.0.0/16 -j ACCEPT\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	s := NewSyncer(f)
	rs := Render(literalModel())
	if len(rs.Conflicts) != 0 || rs.Pods != 2 {
		t.Fatalf("pods %d (want 2), conflicts %v", rs.Pods, rs.Conflicts)
	}
	res, err := s.Sync(ctx, rs, false)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Full || res.Restores != 2 {
		t.Errorf("first sync: %+v, want full with 2 restores", res)
	}
	want4 := `:FLATNET-NP
:<E x/a>
:<I x/a>
:<I x/b>
:<IT x/a>
-A FORWARD -m comment --comment flatnet network policy -j FLATNET-NP
-A FORWARD -s 10.244.0.0/16 -j ACCEPT
-A FLATNET-NP -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN
-A FLATNET-NP -s 10.244.1.5/32 -m comment --comment x/a egress -j <E x/a>
-A FLATNET-NP -d 10.244.1.5/32 -p tcp -m tcp ! --tcp-flags FIN,SYN,RST,ACK SYN -m conntrack --ctstate NEW -m comment --comment x/a egress: a cut flow picked up the other way round -j DROP
-A FLATNET-NP -d 10.244.1.5/32 -m comment --comment x/a ingress -j <I x/a>
-A FLATNET-NP -s 10.244.1.5/32 -p tcp -m tcp ! --tcp-flags FIN,SYN,RST,ACK SYN -m conntrack --ctstate NEW -m comment --comment x/a ingress: a cut flow picked up the other way round -j DROP
-A FLATNET-NP -d 10.244.1.6/32 -m comment --comment x/b ingress -j <I x/b>
-A FLATNET-NP -s 10.244.1.6/32 -p tcp -m tcp ! --tcp-flags FIN,SYN,RST,ACK SYN -m conntrack --ctstate NEW -m comment --comment x/b ingress: a cut flow picked up the other way round -j DROP
-A <E x/a> -d 10.96.0.10/32 -p udp -m udp --dport 53 -j RETURN
-A <E x/a> -m comment --comment NetworkPolicy: isolated by x/dns; no rule allows it -j DROP
-A <I x/a> -s 10.244.9.0/24 -m comment --comment Deny: ClusterNetworkPolicy deny ingress rule 0 -j DROP
-A <I x/a> -s 10.244.9.7/32 -p tcp -m tcp --dport 80 -m comment --comment Deny: ClusterNetworkPolicy deny ingress rule 0 -j DROP
-A <I x/a> -s 10.244.8.0/24 -m comment --comment Pass: ClusterNetworkPolicy pass ingress rule 0 -g <IT x/a>
-A <I x/a> -g <IT x/a>
-A <I x/b> -s 10.244.3.0/24 -p tcp -m tcp --dport 8080:8090 -m comment --comment Accept: ClusterNetworkPolicy first ingress rule 0 -j RETURN
-A <I x/b> -s 10.0.0.0/8 -m comment --comment Deny: ClusterNetworkPolicy base ingress rule 0 -j DROP
-A <IT x/a> -s 10.244.2.0/24 -p tcp -m tcp --dport 80:81 -j RETURN
-A <IT x/a> -p sctp -m sctp --dport 443 -j RETURN
-A <IT x/a> -m comment --comment NetworkPolicy: isolated by x/web; no rule allows it -j DROP`
	if d := cmp.Diff(want4, dump(t, f, ipt.IPv4, "x/a", "x/b")); d != "" {
		t.Errorf("IPv4 (-want +got):\n%s", d)
	}
	want6 := `:FLATNET-NP
:<E x/a>
:<I x/a>
:<IT x/a>
-A FORWARD -m comment --comment flatnet network policy -j FLATNET-NP
-A FLATNET-NP -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN
-A FLATNET-NP -s fd00::5/128 -m comment --comment x/a egress -j <E x/a>
-A FLATNET-NP -d fd00::5/128 -p tcp -m tcp ! --tcp-flags FIN,SYN,RST,ACK SYN -m conntrack --ctstate NEW -m comment --comment x/a egress: a cut flow picked up the other way round -j DROP
-A FLATNET-NP -d fd00::5/128 -m comment --comment x/a ingress -j <I x/a>
-A FLATNET-NP -s fd00::5/128 -p tcp -m tcp ! --tcp-flags FIN,SYN,RST,ACK SYN -m conntrack --ctstate NEW -m comment --comment x/a ingress: a cut flow picked up the other way round -j DROP
-A <E x/a> -m comment --comment NetworkPolicy: isolated by x/dns; no rule allows it -j DROP
-A <I x/a> -s fd00:9::/64 -m comment --comment Pass: ClusterNetworkPolicy pass ingress rule 0 -g <IT x/a>
-A <I x/a> -g <IT x/a>
-A <IT x/a> -s fd00::/48 -p udp -j RETURN
-A <IT x/a> -m comment --comment NetworkPolicy: isolated by x/web; no rule allows it -j DROP`
	if d := cmp.Diff(want6, dump(t, f, ipt.IPv6, "x/a", "x/b")); d != "" {
		t.Errorf("IPv6 (-want +got):\n%s", d)
	}

	before := f.Dump(ipt.IPv4, Table) + f.Dump(ipt.IPv6, Table)
	restores := len(f.Restores)
	if res, err := s.Sync(ctx, Render(literalModel()), false); err != nil || res.Restores != 0 || len(f.Restores) != restores {
		t.Errorf("second sync: %+v, %v, %d restores (want none)", res, err, len(f.Restores)-restores)
	}
	if res, err := s.Sync(ctx, Render(literalModel()), true); err != nil || !res.Full {
		t.Errorf("full sync: %+v, %v", res, err)
	}
	if after := f.Dump(ipt.IPv4, Table) + f.Dump(ipt.IPv6, Table); after != before {
		t.Errorf("a full sync of the same model changed the table:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// One pod's rule changes: only its chain is written.
	m := literalModel()
	m[0].Ingress.Baseline = nil
	restores = len(f.Restores)
	if _, err := s.Sync(ctx, Render(m), false); err != nil {
		t.Fatal(err)
	}
	if got := f.Restores[restores:]; len(got) != 1 || !strings.Contains(got[0], ":"+podChain(directions[1], "x/b", "")+" ") || strings.Count(got[0], "\n") != 4 {
		t.Errorf("changing x/b's ingress wrote:\n%s\nwant one IPv4 restore declaring and refilling its chain only", strings.Join(got, "---\n"))
	}

	removed, err := Cleanup(ctx, f)
	if err != nil || !removed {
		t.Fatalf("Cleanup: %v, %v", removed, err)
	}
	if got := dump(t, f, ipt.IPv4) + "\n" + dump(t, f, ipt.IPv6); got != "-A FORWARD -s 10.244.0.0/16 -j ACCEPT\n" {
		t.Errorf("after Cleanup:\n%s\nwant only the other writer's rule", got)
	}
	if removed, err := Cleanup(ctx, f); err != nil || removed {
		t.Errorf("second Cleanup: %v, %v (want nothing to remove)", removed, err)
	}
}

// TestFullSyncRepairs: a full sync deletes chains of ours it does not
// want (and FORWARD's jumps to them), and moves the jump back to the top
// (once).
func TestFullSyncRepairs(t *testing.T) {
	ctx := context.Background()
	f := ipt.NewFake()
	in := "*filter\n:FLATNET-NP - [0:0]\n:FLATNET-NP-I-OLD - [0:0]\n-A FLATNET-NP-I-OLD -j DROP\n-A FLATNET-NP -j FLATNET-NP-I-OLD\n" +
		"-A FORWARD -j ACCEPT\n-A FORWARD -j FLATNET-NP\n-A FORWARD -j FLATNET-NP-I-OLD\n-A FORWARD -m comment --comment \"flatnet network policy\" -j FLATNET-NP\nCOMMIT\n"
	if err := f.Restore(ctx, ipt.IPv4, []byte(in)); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSyncer(f, ipt.IPv4).Sync(ctx, Render(nil), false); err != nil {
		t.Fatal(err)
	}
	want := `:FLATNET-NP
-A FORWARD -m comment --comment flatnet network policy -j FLATNET-NP
-A FORWARD -j ACCEPT
-A FLATNET-NP -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN`
	if d := cmp.Diff(want, dump(t, f, ipt.IPv4)); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

// TestRenderLeftOut: entries iptables cannot express are reported.
func TestRenderLeftOut(t *testing.T) {
	p := netpol.Pod{Pod: types.NamespacedName{Namespace: "x", Name: "a"}, IPs: []netip.Addr{addr("10.0.0.1"), addr("10.0.0.1"), addr("fd00::1")}}
	p.Ingress.Isolated = true
	p.Ingress.Allowed = []netpol.Allow{{Entry: entry("10.0.0.0/8", 1, 80, 80)}, {Entry: entry("10.0.0.0/8", netpol.ProtoTCP, 90, 80)},
		{Entry: entry("fd00::/8", 1, 80, 80)}}
	q := netpol.Pod{Pod: types.NamespacedName{Namespace: "x", Name: "b"}, IPs: []netip.Addr{addr("10.0.0.1")}}
	rs := Render([]netpol.Pod{q, p})
	var got []string
	for _, err := range rs.Conflicts {
		got = append(got, err.Error())
	}
	want := []string{
		"pod x/b: address 10.0.0.1 is pod x/a's too; left out",
		"pod x/a ingress: entry 10.0.0.0/8 proto-1/80: iptables matches ports of tcp, udp and sctp only; left out",
		"pod x/a ingress: entry 10.0.0.0/8 tcp/90-80: port range 90-80 is empty; left out",
		"pod x/a ingress: entry fd00::/8 proto-1/80: iptables matches ports of tcp, udp and sctp only; left out",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}
