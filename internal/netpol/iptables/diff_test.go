package iptables

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/netpol/netpoltest"
)

// The random models live in a small address space so that peers, pods and
// prefixes overlap often.
var (
	localV4 = []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"}
	localV6 = []string{"fd00::1", "fd00::2", "fd00::3", "fd00::4", "fd00::5"}
	otherV4 = []string{"10.0.0.9", "10.0.0.10", "10.0.1.1", "172.16.0.1"}
	otherV6 = []string{"fd00::9", "fd00:1::1"}
	peersV4 = []string{"10.0.0.0/24", "10.0.0.0/29", "10.0.0.8/30", "10.0.0.2/32", "10.0.0.4/31", "10.0.0.9/32", "0.0.0.0/0", "10.0.0.0/8", "172.16.0.0/12"}
	peersV6 = []string{"fd00::/64", "fd00::2/128", "fd00::/126", "::/0", "fd00:1::/48"}
	protos  = []netpol.Protocol{netpol.ProtoAny, netpol.ProtoTCP, netpol.ProtoUDP, netpol.ProtoSCTP}
)

func pick[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

func randEntries(r *rand.Rand, n int) []netpol.Entry {
	var out []netpol.Entry
	for range n {
		peers := peersV4
		if r.IntN(4) == 0 {
			peers = peersV6
		}
		e := netpol.Entry{Peer: pfx(pick(r, peers)), Proto: pick(r, protos), From: 0, To: 65535}
		if e.Proto != netpol.ProtoAny && r.IntN(8) > 0 {
			e.From = uint16(79 + r.IntN(3))
			e.To = e.From + uint16(r.IntN(3))
		}
		out = append(out, e)
	}
	return out
}

func randTier(r *rand.Rand, d netpol.Direction, actions []netpol.Action) []netpol.TierRule {
	var out []netpol.TierRule
	for i := range r.IntN(4) {
		out = append(out, netpol.TierRule{Action: pick(r, actions), Entries: randEntries(r, 1+r.IntN(3)), Rule: cnp(fmt.Sprintf("cnp-%d", r.IntN(3)), d, i)})
	}
	return out
}

// randModel returns up to five local pods with random rules (each pod its
// own order of tier rules: iptables has a chain per pod).
func randModel(r *rand.Rand) []netpol.Pod {
	var pods []netpol.Pod
	for i := range 1 + r.IntN(5) {
		p := netpol.Pod{Pod: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("p%d", i)}, IPs: []netip.Addr{addr(localV4[i])}}
		if r.IntN(3) == 0 {
			p.IPs = append(p.IPs, addr(localV6[i]))
		}
		for _, d := range []netpol.Direction{netpol.Ingress, netpol.Egress} {
			rules := p.Direction(d)
			rules.Admin = randTier(r, d, []netpol.Action{netpol.Accept, netpol.Deny, netpol.Pass})
			rules.Baseline = randTier(r, d, []netpol.Action{netpol.Accept, netpol.Deny})
			if r.IntN(2) == 0 {
				rules.Isolated = true
				rules.Isolators = []netpol.RuleRef{np("ns", "iso", d, -1)}
				for k, e := range randEntries(r, r.IntN(5)) {
					rules.Allowed = append(rules.Allowed, netpol.Allow{Entry: e, Rule: np("ns", "iso", d, k)})
				}
			}
		}
		pods = append(pods, p)
	}
	return pods
}

func randPacket(r *rand.Rand) packet {
	all := append(slices.Clone(localV4), otherV4...)
	if r.IntN(3) == 0 {
		all = append(slices.Clone(localV6), otherV6...)
	}
	p := packet{src: addr(pick(r, all)), dst: addr(pick(r, all)), proto: pick(r, []netpol.Protocol{netpol.ProtoTCP, netpol.ProtoUDP, netpol.ProtoSCTP, 1}),
		port: uint16(78 + r.IntN(5)), established: r.IntN(10) == 0}
	if p.proto == 1 {
		p.port = 0
	}
	return p
}

// checkFlows walks random flows through the fake's filter table and
// compares with the model; it returns how many it checked.
func checkFlows(t *testing.T, r *rand.Rand, f *ipt.Fake, pods []netpol.Pod, n int) {
	t.Helper()
	tables := map[bool]*ipt.Table{}
	for _, v6 := range []bool{false, true} {
		proto := ipt.IPv4
		if v6 {
			proto = ipt.IPv6
		}
		tb, err := f.Save(context.Background(), proto, Table)
		if err != nil {
			t.Fatal(err)
		}
		tables[v6] = tb
	}
	for range n {
		p := randPacket(r)
		got, err := evaluate(tables[p.src.Is6()], p)
		if err != nil {
			t.Fatal(err)
		}
		w := p.established || netpoltest.Allowed(pods, p.src, p.dst, p.proto, p.port)
		if got != w {
			fam := ipt.IPv4
			if p.src.Is6() {
				fam = ipt.IPv6
			}
			t.Fatalf("%s: iptables allowed=%v, model allowed=%v\nmodel:\n%s\nrules:\n%s", p, got, w, dumpModel(pods), f.Dump(fam, Table))
		}
	}
}

func dumpModel(pods []netpol.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&b, "%s %v\n", p.Pod, p.IPs)
		for _, d := range []netpol.Direction{netpol.Egress, netpol.Ingress} {
			r := p.Direction(d)
			fmt.Fprintf(&b, "  %s isolated=%v\n", d, r.Isolated)
			for _, tr := range r.Admin {
				fmt.Fprintf(&b, "    admin %s %s %v\n", tr.Action, tr.Rule, tr.Entries)
			}
			for _, a := range r.Allowed {
				fmt.Fprintf(&b, "    allow %s\n", a.Entry)
			}
			for _, tr := range r.Baseline {
				fmt.Fprintf(&b, "    baseline %s %s %v\n", tr.Action, tr.Rule, tr.Entries)
			}
		}
	}
	return b.String()
}

// TestDifferential: random models, rendered, synced into the fake and
// walked by the evaluator, give netpol's Check's answer, after a full sync
// and after an incremental one from another model; an incremental sync
// leaves the same tables as a full one; a second sync changes nothing.
func TestDifferential(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	iterations := 500
	if testing.Short() {
		iterations = 50
	}
	ctx := context.Background()
	flows := 0
	for i := range iterations {
		a, b := randModel(r), randModel(r)
		if i%2 == 0 { // a small change
			b = slices.Clone(a)
			k := r.IntN(len(b))
			rules := b[k].Direction([]netpol.Direction{netpol.Ingress, netpol.Egress}[r.IntN(2)])
			rules.Allowed = append(slices.Clone(rules.Allowed), netpol.Allow{Entry: randEntries(r, 1)[0]})
			rules.Isolated = true
		}
		f := ipt.NewFake()
		s := NewSyncer(f)
		if _, err := s.Sync(ctx, Render(a), false); err != nil {
			t.Fatal(err)
		}
		checkFlows(t, r, f, a, 50)
		res, err := s.Sync(ctx, Render(b), false)
		if err != nil || res.Full {
			t.Fatalf("iteration %d: second sync %+v, %v (want incremental)", i, res, err)
		}
		checkFlows(t, r, f, b, 50)
		flows += 100

		fresh := ipt.NewFake()
		if _, err := NewSyncer(fresh).Sync(ctx, Render(b), false); err != nil {
			t.Fatal(err)
		}
		for _, fam := range Families {
			if got, want := f.Dump(fam, Table), fresh.Dump(fam, Table); got != want {
				t.Fatalf("iteration %d %s: incremental sync differs from a full one:\nfull:\n%s\nincremental:\n%s", i, fam, want, got)
			}
		}
		n := len(f.Restores)
		if res, err := s.Sync(ctx, Render(b), false); err != nil || res.Restores != 0 || len(f.Restores) != n {
			t.Fatalf("iteration %d: syncing the same model again: %+v, %v (want no restore)", i, res, err)
		}
	}
	t.Logf("%d models, %d flows: iptables and the model agree", 2*iterations, flows)
}
