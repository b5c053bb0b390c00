package agent

// --policy-mode: which renderer enforces NetworkPolicy. nftables (one
// table of sets: a packet's cost does not grow with the policies) is the
// one to run; iptables (netpol/iptables: a chain per pod, linear rules) is
// the fallback where nft is missing or does not work. auto takes nftables
// when nft works and says why it does not otherwise. The gate and the
// conntrack cut do not depend on the renderer; the per-policy drop
// counters exist in nftables mode only. Each mode removes what the other
// left, so a restart in another mode leaves one set of rules.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/netpol/iptables"
	"github.com/flatnet/flatnet/internal/netpol/nftables"
	"github.com/flatnet/flatnet/internal/nft"
)

const (
	policyModeAuto     = "auto"
	policyModeNFTables = "nftables"
	policyModeIPTables = "iptables"
)

var policyModes = []string{policyModeAuto, policyModeNFTables, policyModeIPTables}

// policyModeHelp is --policy-mode's help.
const policyModeHelp = "--network-policy: the renderer: nftables (table inet " + nftables.DefaultTable + "), iptables (chains " + iptables.ChainTop +
	"* in the filter table, reached from FORWARD; a rule per pod and peer, so a new flow's cost grows with the policies; " +
	"no per-policy drop counters in the metrics), or auto: nftables when nft works, else iptables (the log says why)"

func validPolicyMode(m string) error {
	if m != "" && !slices.Contains(policyModes, m) { // "": auto
		return fmt.Errorf("--policy-mode must be one of %s (got %q)", strings.Join(policyModes, ", "), m)
	}
	return nil
}

// iptFamilies are the iptables families of the cluster's CIDRs.
func iptFamilies(cidrs []netip.Prefix) []ipt.Protocol {
	var out []ipt.Protocol
	for _, f := range iptables.Families {
		if slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Addr().Is6() == (f == ipt.IPv6) }) {
			out = append(out, f)
		}
	}
	return out
}

// choosePolicyMode returns the mode to run (nftables or iptables) and,
// for nftables, the working nft.
func choosePolicyMode(ctx context.Context, mode string, families []ipt.Protocol) (string, *nft.Runner, error) {
	var nftErr error
	if mode != policyModeIPTables {
		r, err := nft.New(knftables.InetFamily, nftables.DefaultTable, nft.StandardPaths...)
		if err == nil {
			if err = r.Probe(ctx); err != nil {
				err = fmt.Errorf("nft does not work here: %w", err)
			}
		}
		if err == nil {
			return policyModeNFTables, r, nil
		}
		if mode == policyModeNFTables {
			return "", nil, fmt.Errorf("--network-policy needs nftables with --policy-mode=nftables: %w (--policy-mode=auto falls back to iptables)", err)
		}
		nftErr = err
	}
	for _, f := range families {
		if err := probeIPTables(ctx, f); err != nil {
			if nftErr != nil {
				return "", nil, fmt.Errorf("--network-policy needs nftables or iptables: %w; and %s does not work: %w%s", nftErr, f, err, legacyHint)
			}
			return "", nil, fmt.Errorf("--network-policy with --policy-mode=iptables: %s does not work: %w%s", f, err, legacyHint)
		}
	}
	if nftErr != nil {
		klog.FromContext(ctx).Info("Enforcing NetworkPolicy with iptables, whose rules grow with the policies, because nftables does not work here; "+
			"install nftables (nft v1.0.1 or later) and restart the agent to use it", "reason", nftErr.Error())
	}
	return policyModeIPTables, nil, nil
}

// legacyHint: iptables-nft needs the nf_tables the kernel may be missing.
const legacyHint = " (on a kernel without nf_tables, iptables must be the legacy flavour: " +
	"`update-alternatives --set iptables /usr/sbin/iptables-legacy`, and ip6tables likewise)"

// probeIPTables checks that f's iptables can read and write the filter
// table, changing nothing (an empty commit).
func probeIPTables(ctx context.Context, f ipt.Protocol) error {
	if err := ipt.Available(f); err != nil {
		return err
	}
	r := ipt.New()
	if _, err := r.Save(ctx, f, iptables.Table); err != nil {
		return err
	}
	return r.Restore(ctx, f, []byte("*"+iptables.Table+"\nCOMMIT\n"))
}

// removeOtherPolicyRules removes what an agent in another policy mode
// than keep left; keep "" (no --network-policy) removes both.
func removeOtherPolicyRules(ctx context.Context, keep string) {
	why := "NetworkPolicy is no longer enforced on this node"
	if keep != "" {
		why = "NetworkPolicy is now enforced with " + keep
	}
	if keep != policyModeNFTables {
		removeStalePolicyTable(ctx, why)
	}
	if keep != policyModeIPTables {
		logger := klog.FromContext(ctx)
		var families []ipt.Protocol
		for _, f := range iptables.Families {
			if ipt.Available(f) == nil {
				families = append(families, f)
			}
		}
		if len(families) == 0 {
			return // no iptables: no chains either
		}
		removed, err := iptables.Cleanup(ctx, ipt.New(), families...)
		if err != nil {
			logger.Error(err, "Removing the network policy chains left by an agent with --policy-mode=iptables", "chains", iptables.ChainTop+"*")
		}
		if removed {
			logger.Info("Removed the network policy chains left by an agent with --policy-mode=iptables: "+why, "chains", iptables.ChainTop+"*")
		}
	}
}

// policyCommit is what rendering and committing the node's pods came to,
// in either mode.
type policyCommit struct {
	full bool
	// operations: nft operations, or iptables-restore lines.
	operations int
	// pods some policy selects; elements in the sets (nftables), rules in
	// the chains (iptables).
	pods, elements, rules int
	counters              map[string]nftables.Counter // nftables only
}

// commit renders local with the controller's mode and commits it; the
// errors are what the renderer left out.
func (c *policyController) commit(ctx context.Context, local []netpol.Pod, full bool) (policyCommit, []error, error) {
	if c.ipt != nil {
		rs := iptables.Render(local)
		res, err := c.ipt.Sync(ctx, rs, full)
		return policyCommit{full: res.Full, operations: res.Lines, pods: rs.Pods, rules: rs.NumRules()}, rs.Conflicts, err
	}
	rs, err := c.renderer.Render(local)
	if err != nil {
		return policyCommit{}, nil, err
	}
	res, err := c.syncer.Sync(ctx, rs, full)
	return policyCommit{full: res.Full, operations: res.Operations, pods: rs.Pods, elements: rs.NumElements(), counters: rs.Counters}, rs.Conflicts, err
}

// noCounters is the metrics' counter reader in iptables mode: no named
// counters, so no per-policy drops.
type noCounters struct{}

func (noCounters) ListCounters(context.Context) ([]*knftables.Counter, error) { return nil, nil }
