package nftables

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/netpol/netpoltest"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/nft/nfttrace"
)

// The random models live in a small address space so that peers, pods and
// prefixes overlap often.
var (
	localV4  = []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"}
	localV6  = []string{"fd00::1", "fd00::2", "fd00::3", "fd00::4", "fd00::5"}
	otherV4  = []string{"10.0.0.9", "10.0.0.10", "10.0.1.1", "172.16.0.1"}
	otherV6  = []string{"fd00::9", "fd00:1::1"}
	peersV4  = []string{"10.0.0.0/24", "10.0.0.0/29", "10.0.0.8/30", "10.0.0.2/32", "10.0.0.4/31", "10.0.0.9/32", "0.0.0.0/0", "10.0.0.0/8", "172.16.0.0/12"}
	peersV6  = []string{"fd00::/64", "fd00::2/128", "fd00::/126", "::/0", "fd00:1::/48"}
	protos   = []netpol.Protocol{netpol.ProtoAny, netpol.ProtoTCP, netpol.ProtoUDP, netpol.ProtoSCTP}
	traceTCP = map[netpol.Protocol]string{netpol.ProtoTCP: "tcp", netpol.ProtoUDP: "udp", netpol.ProtoSCTP: "sctp", 1: "icmp"}
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
		if e.Proto != netpol.ProtoAny {
			e.From = uint16(79 + r.IntN(3))
			e.To = e.From + uint16(r.IntN(3))
		}
		out = append(out, e)
	}
	return out
}

type globalRule struct {
	ref    netpol.RuleRef
	action netpol.Action
	prio   int32
}

// randModel returns up to five local pods with random rules; tier rules
// come from one global list per tier, in the compiler's order.
func randModel(r *rand.Rand) []netpol.Pod {
	globals := map[netpol.Direction][2][]globalRule{}
	for _, d := range []netpol.Direction{netpol.Ingress, netpol.Egress} {
		var tiers [2][]globalRule
		for t := range tiers {
			for i := range r.IntN(4) {
				g := globalRule{ref: cnp(fmt.Sprintf("cnp-%d-%d", t, r.IntN(3)), d, i), prio: int32(r.IntN(3))}
				g.action = []netpol.Action{netpol.Accept, netpol.Deny, netpol.Pass}[r.IntN(3-t)]
				tiers[t] = append(tiers[t], g)
			}
			slices.SortFunc(tiers[t], func(a, b globalRule) int {
				return compareRules(&tierRule{ref: a.ref, prio: a.prio}, &tierRule{ref: b.ref, prio: b.prio})
			})
			tiers[t] = slices.CompactFunc(tiers[t], func(a, b globalRule) bool { return keyOf(a.ref) == keyOf(b.ref) })
		}
		globals[d] = tiers
	}
	var pods []netpol.Pod
	for i := range 1 + r.IntN(5) {
		p := netpol.Pod{Pod: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("p%d", i)}, IPs: []netip.Addr{addr(localV4[i])}}
		if r.IntN(3) == 0 {
			p.IPs = append(p.IPs, addr(localV6[i]))
		}
		for _, d := range []netpol.Direction{netpol.Ingress, netpol.Egress} {
			rules := p.Direction(d)
			for t, list := range globals[d] {
				for _, g := range list {
					if r.IntN(2) == 0 {
						continue
					}
					tr := netpol.TierRule{Action: g.action, Entries: randEntries(r, 1+r.IntN(3)), Rule: g.ref, Priority: g.prio}
					if t == 0 {
						rules.Admin = append(rules.Admin, tr)
					} else {
						rules.Baseline = append(rules.Baseline, tr)
					}
				}
			}
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

// checkFlows traces random flows through fake and compares with the model.
func checkFlows(t *testing.T, r *rand.Rand, fake *nft.Fake, pods []netpol.Pod, n int) {
	t.Helper()
	tr := nfttrace.New(fake.Fake)
	for range n {
		v4 := r.IntN(3) > 0
		all := append(slices.Clone(localV4), otherV4...)
		if !v4 {
			all = append(slices.Clone(localV6), otherV6...)
		}
		src, dst := addr(pick(r, all)), addr(pick(r, all))
		proto := pick(r, []netpol.Protocol{netpol.ProtoTCP, netpol.ProtoUDP, netpol.ProtoSCTP, 1})
		port := uint16(78 + r.IntN(5))
		if proto == 1 {
			port = 0
		}
		res, err := tr.Trace(nfttrace.Packet{Src: src, Dst: dst, Proto: traceTCP[proto], DPort: port})
		if err != nil {
			t.Fatal(err)
		}
		if got, w := res.Verdict == nfttrace.Accept, netpoltest.Allowed(pods, src, dst, proto, port); got != w {
			t.Fatalf("%s -> %s %s/%d: nftables allowed=%v, model allowed=%v\nmodel:\n%s\ntrace:\n%s\nruleset:\n%s",
				src, dst, traceTCP[proto], port, got, w, dumpModel(pods), strings.Join(res.Trace, "\n"), fake.Dump())
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

// tableOf is the fake table's content: chains' rules in order, sets'
// elements sorted.
func tableOf(f *nft.Fake) map[string][]string {
	out := map[string][]string{}
	f.RLock()
	defer f.RUnlock()
	for name, c := range f.Table.Chains {
		out["chain "+name] = []string{}
		for _, r := range c.Rules {
			s := r.Rule
			if r.Comment != nil {
				s += " comment " + *r.Comment
			}
			out["chain "+name] = append(out["chain "+name], s)
		}
	}
	for name, s := range f.Table.Sets {
		out["set "+name] = []string{s.Type}
		var elems []string
		for _, e := range s.Elements {
			elems = append(elems, strings.Join(e.Key, " . "))
		}
		slices.Sort(elems)
		out["set "+name] = append(out["set "+name], elems...)
	}
	return out
}

// TestDifferential: random models, rendered and traced, give the same
// answer as netpol's Check, after a full sync and after an incremental one
// from another model; an incremental sync leaves the same table as a full
// one; a second sync changes nothing.
func TestDifferential(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	iterations := 400
	if testing.Short() {
		iterations = 50
	}
	ctx := context.Background()
	for i := range iterations {
		a, b := randModel(r), randModel(r)
		if i%2 == 0 {
			// A small change: the Renderer's memory serves the rest.
			b = slices.Clone(a)
			k := r.IntN(len(b))
			rules := b[k].Direction([]netpol.Direction{netpol.Ingress, netpol.Egress}[r.IntN(2)])
			rules.Allowed = append(slices.Clone(rules.Allowed), netpol.Allow{Entry: randEntries(r, 1)[0]})
			rules.Isolated = true
		}
		fake := nft.NewFake(knftables.InetFamily, testTable)
		s := NewSyncer(fake)
		rd := NewRenderer()
		syncWith(t, rd, s, a)
		checkFlows(t, r, fake, a, 50)
		if res := syncWith(t, rd, s, b); res.Full {
			t.Fatalf("iteration %d: the second sync was full", i)
		}
		checkFlows(t, r, fake, b, 50)
		requireDisjoint(t, fake)

		fresh := nft.NewFake(knftables.InetFamily, testTable)
		syncWith(t, NewRenderer(), NewSyncer(fresh), b)
		if diff := cmp.Diff(tableOf(fresh), tableOf(fake)); diff != "" {
			t.Fatalf("iteration %d: incremental sync differs from a full one (-full +incremental):\n%s", i, diff)
		}
		runs := fake.Runs()
		rs, _ := rd.Render(b)
		if res, err := s.Sync(ctx, rs, false); err != nil || res.Operations != 0 || fake.Runs() != runs {
			t.Fatalf("iteration %d: syncing the same model again: %+v, %v, %d transactions (want none)", i, res, err, fake.Runs()-runs)
		}
	}
}

// fieldRange parses one element field (address, prefix, range, number) as
// a closed interval of comparable values.
func fieldRange(t *testing.T, f string) (lo, hi netip.Addr) {
	t.Helper()
	num := func(s string) netip.Addr {
		var n uint16
		if _, err := fmt.Sscan(s, &n); err != nil {
			t.Fatalf("bad field %q", f)
		}
		return netip.AddrFrom4([4]byte{0, 0, byte(n >> 8), byte(n)})
	}
	one := func(s string) netip.Addr {
		if a, err := netip.ParseAddr(s); err == nil {
			return a
		}
		return num(s)
	}
	if p, err := netip.ParsePrefix(f); err == nil {
		return p.Addr(), lastAddr(p)
	}
	if l, h, ok := strings.Cut(f, "-"); ok {
		return one(l), one(h)
	}
	return one(f), one(f)
}

// requireDisjoint fails when two elements of an interval set overlap: the
// kernel refuses the second ("File exists"), and the fake would not.
func requireDisjoint(t *testing.T, f *nft.Fake) {
	t.Helper()
	f.RLock()
	defer f.RUnlock()
	for name, s := range f.Table.Sets {
		for i, a := range s.Elements {
			for _, b := range s.Elements[i+1:] {
				overlap := true
				for k := range a.Key {
					alo, ahi := fieldRange(t, a.Key[k])
					blo, bhi := fieldRange(t, b.Key[k])
					if ahi.Less(blo) || bhi.Less(alo) {
						overlap = false
						break
					}
				}
				if overlap {
					t.Fatalf("set %s: elements %q and %q overlap", name, strings.Join(a.Key, " . "), strings.Join(b.Key, " . "))
				}
			}
		}
	}
}

// syncWith renders pods with rd and syncs them.
func syncWith(t testing.TB, rd *Renderer, s *Syncer, pods []netpol.Pod) Result {
	t.Helper()
	rs, err := rd.Render(pods)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Sync(context.Background(), rs, false)
	if err != nil {
		t.Fatal(err)
	}
	return res
}
