package agent

import (
	"context"
	"fmt"
	"net/netip"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/proxy/conntrack"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/proxy/proxier"
)

// newProxiers returns one Service proxier per family of the cluster CIDRs
// (--proxy), each on its own nftables table.
func newProxiers(client kubernetes.Interface, o Options, cidrs []netip.Prefix) ([]*proxier.Proxier, error) {
	byFamily := map[knftables.Family][]netip.Prefix{}
	for _, c := range cidrs {
		fam := knftables.IPv4Family
		if c.Addr().Is6() {
			fam = knftables.IPv6Family
		}
		byFamily[fam] = append(byFamily[fam], c)
	}
	var out []*proxier.Proxier
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		if len(byFamily[fam]) == 0 {
			continue
		}
		runner, err := nft.New(fam, nftables.DefaultTable)
		if err != nil {
			return nil, fmt.Errorf("--proxy: %w", err)
		}
		out = append(out, proxier.New(proxier.Config{
			Client: client,
			NFT:    runner,
			Render: nftables.Config{Family: fam, NodeName: o.NodeName, ClusterCIDRs: byFamily[fam]},
			// kube-proxy's defaults: --min-sync-period 1s, --sync-period 30s.
			MinSyncInterval: o.ProxyMinSyncPeriod,
			MaxSyncInterval: o.ProxySyncPeriod,
			// Stale UDP/SCTP flows are deleted in the agent's own netns.
			Conntrack: conntrack.Netlink{},
		}))
	}
	return out, nil
}

// runProxier runs p until ctx ends; an early stop is an error.
func runProxier(ctx context.Context, p *proxier.Proxier) error {
	if err := p.Run(ctx); err != nil {
		return err
	}
	if ctx.Err() == nil {
		return fmt.Errorf("stopped")
	}
	return nil
}
