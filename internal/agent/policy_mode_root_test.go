package agent

import (
	"context"
	"slices"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/netpol/iptables"
	"github.com/flatnet/flatnet/internal/netpol/nftables"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootPolicyModeSwitch: an agent starting in one policy mode removes
// the other mode's rules (a restart in another mode), and without
// --network-policy both; --policy-mode=iptables works where iptables does.
func TestRootPolicyModeSwitch(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := nft.LookPath(); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs nftables)", err)
	}
	for _, f := range iptables.Families {
		if err := ipt.Available(f); err != nil {
			testutil.Skip(t, "%v (hack/deps.sh installs iptables)", err)
		}
	}
	ns := testutil.NewNetNS(t)
	ctx := context.Background()
	err := netns.Do(ns, func() error {
		r, err := nft.New(knftables.InetFamily, nftables.DefaultTable, nft.StandardPaths...)
		if err != nil {
			return err
		}
		nftHas := func() bool {
			tb, err := r.ListTable(ctx)
			return err == nil && tb != nil
		}
		iptHas := func() bool {
			tb, err := ipt.New().Save(ctx, ipt.IPv4, iptables.Table)
			return err == nil && slices.ContainsFunc(tb.Chains, iptables.Ours)
		}
		both := func() error {
			rs, err := nftables.Render(nil)
			if err != nil {
				return err
			}
			if _, err := nftables.NewSyncer(r).Sync(ctx, rs, true); err != nil {
				return err
			}
			_, err = iptables.NewSyncer(ipt.New()).Sync(ctx, iptables.Render(nil), true)
			return err
		}
		for _, step := range []struct {
			keep             string
			wantNFT, wantIPT bool
		}{{policyModeIPTables, false, true}, {policyModeNFTables, true, false}, {"", false, false}} {
			if err := both(); err != nil {
				return err
			}
			if !nftHas() || !iptHas() {
				t.Fatalf("setup: nft table %v, iptables chains %v", nftHas(), iptHas())
			}
			removeOtherPolicyRules(ctx, step.keep)
			if nftHas() != step.wantNFT || iptHas() != step.wantIPT {
				t.Errorf("keep %q: nft table left %v (want %v), iptables chains left %v (want %v)", step.keep, nftHas(), step.wantNFT, iptHas(), step.wantIPT)
			}
		}
		mode, _, err := choosePolicyMode(ctx, policyModeIPTables, iptables.Families)
		if err != nil || mode != policyModeIPTables {
			t.Errorf("--policy-mode=iptables: %q, %v", mode, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
