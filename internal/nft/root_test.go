package nft

import (
	"context"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootRunner drives the real nft binary in a test namespace.
func TestRootRunner(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := LookPath(); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs nftables)", err)
	}
	ns := testutil.NewNetNS(t)
	ctx := context.Background()
	table := testutil.Name("fntest-")
	err := netns.Do(ns, func() error {
		r, err := New(knftables.InetFamily, table)
		if err != nil {
			return err
		}
		if err := r.Probe(ctx); err != nil {
			t.Errorf("Probe: %v", err)
		}
		if tb, err := r.ListTable(ctx); tb != nil || err != nil {
			t.Errorf("ListTable before creation: %v, %v", tb, err)
		}
		tx := r.NewTransaction()
		tx.Add(&knftables.Table{Comment: knftables.PtrTo("flatnet test")})
		tx.Add(&knftables.Chain{Name: "pre", Type: knftables.PtrTo(knftables.NATType), Hook: knftables.PtrTo(knftables.PreroutingHook), Priority: knftables.PtrTo(knftables.DNATPriority)})
		tx.Add(&knftables.Chain{Name: "c"})
		tx.Add(&knftables.Rule{Chain: "pre", Rule: "fib daddr type local jump c", Comment: knftables.PtrTo("entry")})
		tx.Add(&knftables.Rule{Chain: "c", Rule: "meta nfproto ipv4 tcp dport 80 dnat ip to 10.1.0.2:8080"})
		if err := r.Run(ctx, tx); err != nil {
			return err
		}
		tb, err := r.ListTable(ctx)
		if err != nil {
			return err
		}
		if !tb.HasChain("pre") || !tb.HasChain("c") || len(tb.Rules) != 2 {
			t.Fatalf("ListTable: %+v", tb)
		}
		entry := tb.RulesIn("pre")[0]
		if entry.Comment == nil || *entry.Comment != "entry" || entry.Handle == nil || tb.RulesIn("c")[0].Comment != nil {
			t.Fatalf("rules: %+v %+v", entry, tb.RulesIn("c")[0])
		}
		// Delete by listed handle, then the chain.
		tx = r.NewTransaction()
		tx.Delete(&knftables.Rule{Chain: "pre", Handle: entry.Handle})
		tx.Flush(&knftables.Chain{Name: "c"})
		tx.Delete(&knftables.Chain{Name: "c"})
		if err := r.Run(ctx, tx); err != nil {
			return err
		}
		if tb, _ := r.ListTable(ctx); tb.HasChain("c") || len(tb.Rules) != 0 {
			t.Fatalf("after delete: %+v", tb)
		}
		// Missing objects are IsNotFound; invalid transactions never reach nft.
		tx = r.NewTransaction()
		tx.Delete(&knftables.Chain{Name: "nope"})
		if err := r.Run(ctx, tx); !IsNotFound(err) {
			t.Errorf("deleting a missing chain: %v", err)
		}
		tx = r.NewTransaction()
		tx.Add(&knftables.Rule{Chain: "pre"})
		if err := r.Run(ctx, tx); err == nil {
			t.Error("invalid transaction ran")
		}
		tx = r.NewTransaction()
		tx.Delete(&knftables.Table{})
		return r.Run(ctx, tx)
	})
	if err != nil {
		t.Fatal(err)
	}
}
