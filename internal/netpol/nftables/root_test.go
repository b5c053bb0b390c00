package nftables

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/testutil"
)

// realisticModel: dual-stack pods, overlapping allows (made disjoint),
// Admin rules of every action, a Baseline rule.
func realisticModel(extra bool) []netpol.Pod {
	var pods []netpol.Pod
	for i := range 6 {
		p := netpol.Pod{
			Pod: types.NamespacedName{Namespace: "x", Name: fmt.Sprintf("p%d", i)},
			IPs: []netip.Addr{addr(fmt.Sprintf("10.244.1.%d", 10+i)), addr(fmt.Sprintf("fd00:244:1::%x", 10+i))},
		}
		p.Ingress = netpol.Rules{
			Admin: []netpol.TierRule{
				{Action: netpol.Deny, Entries: []netpol.Entry{anyProto("10.244.9.0/24"), tcp("10.244.9.7/32", 80, 80)}, Rule: cnp("deny", netpol.Ingress, 0), Priority: 1},
				{Action: netpol.Pass, Entries: []netpol.Entry{anyProto("fd00:244:9::/64")}, Rule: cnp("pass", netpol.Ingress, 0), Priority: 2},
			},
			Isolated: i%2 == 0,
			Allowed: []netpol.Allow{
				{Entry: anyProto("10.244.0.0/16"), Rule: np("x", "a", netpol.Ingress, 0)},
				{Entry: tcp("10.244.2.0/24", 80, 81), Rule: np("x", "b", netpol.Ingress, 0)},
				{Entry: tcp("0.0.0.0/0", 443, 443), Rule: np("x", "c", netpol.Ingress, 0)},
				{Entry: netpol.Entry{Peer: pfx("fd00:244::/48"), Proto: netpol.ProtoUDP, From: 53, To: 53}, Rule: np("x", "c", netpol.Ingress, 1)},
			},
			Baseline: []netpol.TierRule{{Action: netpol.Deny, Entries: []netpol.Entry{anyProto("0.0.0.0/0")}, Rule: cnp("base", netpol.Ingress, 0)}},
		}
		p.Egress = netpol.Rules{Isolated: i == 1, Allowed: []netpol.Allow{{Entry: netpol.Entry{Peer: pfx("10.96.0.10/32"), Proto: netpol.ProtoUDP, From: 53, To: 53}}}}
		if extra {
			p.Ingress.Admin = append([]netpol.TierRule{{Action: netpol.Accept, Entries: []netpol.Entry{tcp("10.244.3.0/24", 8080, 8090)}, Rule: cnp("first", netpol.Ingress, 0)}}, p.Ingress.Admin[1:]...)
			p.Ingress.Allowed = p.Ingress.Allowed[1:]
		}
		pods = append(pods, p)
	}
	return pods
}

var protoNumber = map[string]string{"tcp": "6", "udp": "17", "sctp": "132"}

// readBack lists every set's elements and the chains from the kernel, in
// the Ruleset's spelling.
func readBack(t *testing.T, ctx context.Context, r *nft.Runner) (chains []string, elems map[string][]string) {
	t.Helper()
	all, err := r.ListAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	elems = map[string][]string{}
	for _, set := range all["set"] {
		es, err := r.ListElements(ctx, "set", set)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			key := slices.Clone(e.Key)
			for i, f := range key {
				if n, ok := protoNumber[f]; ok {
					key[i] = n
				}
			}
			elems[set] = append(elems[set], strings.Join(key, " . "))
		}
		slices.Sort(elems[set])
	}
	chains = all["chain"]
	slices.Sort(chains)
	return chains, elems
}

func wantBack(rs *Ruleset) (chains []string, elems map[string][]string) {
	elems = map[string][]string{}
	for set := range rs.Sets {
		for _, keys := range rs.Elements[set] {
			elems[set] = append(elems[set], keys...)
		}
		slices.Sort(elems[set])
	}
	return slices.Sorted(maps.Keys(rs.Chains)), elems
}

// TestRootKernel commits a realistic ruleset with the real nft, reads it
// back, syncs a change incrementally (the kernel checks the order of
// operations the fake does not), and logs what 10,000 elements cost.
func TestRootKernel(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := nft.LookPath(); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs nftables)", err)
	}
	ns := testutil.NewNetNS(t)
	table := testutil.Name("fnpol-")
	ctx := context.Background()
	err := netns.Do(ns, func() error {
		r, err := nft.New(knftables.InetFamily, table)
		if err != nil {
			return err
		}
		s := NewSyncer(r)
		for step, model := range [][]netpol.Pod{realisticModel(false), realisticModel(true), realisticModel(false), nil} {
			rs, err := Render(model)
			if err != nil {
				return err
			}
			res, err := s.Sync(ctx, rs, false)
			if err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
			if step > 0 && res.Full {
				t.Errorf("step %d: full sync, want incremental", step)
			}
			gotChains, gotElems := readBack(t, ctx, r)
			wantChains, wantElems := wantBack(rs)
			if d := cmp.Diff(wantChains, gotChains); d != "" {
				t.Errorf("step %d: chains (-want +kernel):\n%s", step, d)
			}
			if d := cmp.Diff(wantElems, gotElems); d != "" {
				t.Errorf("step %d: elements (-want +kernel):\n%s", step, d)
			}
			if res, err := s.Sync(ctx, rs, false); err != nil || res.Operations != 0 {
				t.Errorf("step %d: second sync: %+v, %v", step, res, err)
			}
		}

		// 10,000 elements: 100 pods allowing 100 peers each.
		var big []netpol.Pod
		for i := range 100 {
			p := netpol.Pod{Pod: types.NamespacedName{Namespace: "big", Name: fmt.Sprintf("p%d", i)},
				IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 245, byte(i / 250), byte(1 + i%250)})}}
			p.Ingress.Isolated = true
			for k := range 100 {
				peer := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 246, byte(k), byte(i)}), 32)
				p.Ingress.Allowed = append(p.Ingress.Allowed, netpol.Allow{Entry: netpol.Entry{Peer: peer, Proto: netpol.ProtoTCP, From: 80, To: 80}})
			}
			big = append(big, p)
		}
		rs, err := Render(big)
		if err != nil {
			return err
		}
		start := time.Now()
		if _, err := s.Sync(ctx, rs, true); err != nil {
			return err
		}
		full := time.Since(start)
		big[0].Ingress.Allowed = big[0].Ingress.Allowed[1:]
		rs2, _ := Render(big)
		start = time.Now()
		res, err := s.Sync(ctx, rs2, false)
		if err != nil {
			return err
		}
		t.Logf("full sync of %d elements: %s; one element changed: %s (%d operations)", rs.NumElements(), full, time.Since(start), res.Operations)
		if _, got := readBack(t, ctx, r); len(got["ingress-allow-v4"]) != 9999 {
			t.Errorf("kernel has %d allow elements, want 9999", len(got["ingress-allow-v4"]))
		}
		tx := r.NewTransaction()
		tx.Delete(&knftables.Table{})
		return r.Run(ctx, tx)
	})
	if err != nil {
		t.Fatal(err)
	}
}
