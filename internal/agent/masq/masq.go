// Package masq masquerades the node's pod traffic that leaves the cluster:
// a packet from the cluster CIDR to a destination outside it leaves with
// the node's address (so replies find their way back on a network that
// knows nothing of pod subnets); pod-to-pod traffic, on this node or
// across nodes, is never rewritten, so pods see each other's real IPs.
//
// One nftables table, owned entirely by the agent:
//
//	table inet flatnet-agent
//	    chain postrouting (nat, srcnat):
//	        ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return     pod to pod
//	        ip saddr 10.244.0.0/16 ip daddr 224.0.0.0/4 return       multicast stays local
//	        ip saddr 10.244.0.0/16 masquerade fully-random           leaving the cluster
//
// (ip6 rules likewise for an IPv6 cluster CIDR). Sync reads the table's
// rule comments, which name every rule and its CIDRs, and rewrites the
// table in one transaction only when they differ from the desired ones:
// a second Sync with the same input runs no nftables transaction.
// fully-random picks NAT source ports at random, which avoids the
// conntrack insertion races of sequential port allocation under load.
package masq

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
)

const (
	// Table is the agent's nftables table (family inet).
	Table = "flatnet-agent"
	chain = "postrouting"
)

// Masq writes the masquerade table through nft.
type Masq struct {
	nft nft.Interface
}

// New returns a Masq over n, bound to family inet and table Table
// (nft.NewFake(knftables.InetFamily, masq.Table) in tests).
func New(n nft.Interface) *Masq { return &Masq{nft: n} }

// NewDefault returns a Masq that runs the nft binary.
func NewDefault() (*Masq, error) {
	r, err := nft.New(knftables.InetFamily, Table, nft.StandardPaths...)
	if err != nil {
		return nil, fmt.Errorf("masquerade needs nftables: %w", err)
	}
	return New(r), nil
}

type rule struct{ text, comment string }

// rules returns the postrouting rules for clusterCIDRs.
func rules(clusterCIDRs []netip.Prefix) ([]rule, error) {
	var out []rule
	for _, c := range clusterCIDRs {
		if !c.IsValid() || c.Addr().Is4In6() {
			return nil, fmt.Errorf("invalid cluster CIDR %v", c)
		}
		c = c.Masked()
		fam, mcast := "ip", "224.0.0.0/4"
		if c.Addr().Is6() {
			fam, mcast = "ip6", "ff00::/8"
		}
		src := knftables.Concat(fam, "saddr", c)
		out = append(out,
			rule{knftables.Concat(src, fam, "daddr", c, "return"), fmt.Sprintf("%s to %s: pod to pod, no NAT", c, c)},
			rule{knftables.Concat(src, fam, "daddr", mcast, "return"), fmt.Sprintf("%s to multicast: no NAT", c)},
			rule{knftables.Concat(src, "masquerade fully-random"), fmt.Sprintf("%s leaving the cluster: masquerade", c)},
		)
	}
	return out, nil
}

// Sync makes the table masquerade traffic from clusterCIDRs that leaves
// them. It changes nothing when the table is already so.
func (m *Masq) Sync(ctx context.Context, clusterCIDRs []netip.Prefix) (changed bool, err error) {
	want, err := rules(clusterCIDRs)
	if err != nil {
		return false, err
	}
	cur, err := m.nft.ListTable(ctx)
	if err != nil {
		return false, fmt.Errorf("reading nftables table %s: %w", Table, err)
	}
	if upToDate(cur, want) {
		return false, nil
	}
	tx := m.nft.NewTransaction()
	if cur != nil {
		// Something else is there (an older ruleset, a hand edit):
		// replace the whole table in the same transaction.
		tx.Delete(&knftables.Table{})
	}
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("flatnet agent: masquerade pod traffic leaving the cluster CIDR")})
	tx.Add(&knftables.Chain{
		Name:     chain,
		Type:     knftables.PtrTo(knftables.NATType),
		Hook:     knftables.PtrTo(knftables.PostroutingHook),
		Priority: knftables.PtrTo(knftables.SNATPriority),
	})
	for _, r := range want {
		tx.Add(&knftables.Rule{Chain: chain, Rule: r.text, Comment: knftables.PtrTo(nft.Comment(r.comment))})
	}
	if err := m.nft.Run(ctx, tx); err != nil {
		return false, fmt.Errorf("writing nftables table %s: %w", Table, err)
	}
	return true, nil
}

func upToDate(cur *nft.Table, want []rule) bool {
	if cur == nil || !slices.Equal(cur.Chains, []string{chain}) || len(cur.Rules) != len(want) {
		return false
	}
	for i, r := range cur.Rules {
		if r.Chain != chain || r.Comment == nil || *r.Comment != nft.Comment(want[i].comment) {
			return false
		}
	}
	return true
}

// Remove deletes the table (masquerade turned off); a missing table is
// success.
func (m *Masq) Remove(ctx context.Context) error {
	cur, err := m.nft.ListTable(ctx)
	if err != nil || cur == nil {
		return err
	}
	tx := m.nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := m.nft.Run(ctx, tx); err != nil && !nft.IsNotFound(err) {
		return fmt.Errorf("removing nftables table %s: %w", Table, err)
	}
	return nil
}
