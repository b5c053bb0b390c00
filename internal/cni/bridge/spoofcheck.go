package bridge

// MAC spoof check ("macspoofchk"): frames entering the bridge from a
// container's port must carry the container interface's MAC.
//
// Same shape as internal/cni/ipmasq (read its note): one table, bridge
// flatnet-cni-spoofchk, a base chain at bridge prerouting that dispatches
// on the input port through a verdict map, and one chain per attachment,
// named by a hash of (network) and (container ID, ifname):
//
//	map ports { type ifname : verdict }      "vethXXXX" -> goto s-<net>-<att>
//	chain prerouting (filter, priority -300): iifname vmap @ports
//	chain s-<net>-<att>: ether saddr <mac> return; drop
//
// ADD adds in one transaction; DEL reads the map to find its elements (the
// host port may be gone, and its name is not derivable), then deletes.

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/ipmasq"
	"github.com/flatnet/flatnet/internal/nft"
)

const (
	spoofTable = "flatnet-cni-spoofchk"
	spoofBase  = "prerouting"
	spoofMap   = "ports"
)

type spoofChecker struct {
	nft knftables.Interface
}

// newSpoofChecker programs the table over netlink (ipmasq.NewNFT: code
// 105 when nf_tables does not answer).
func newSpoofChecker() (*spoofChecker, error) {
	r, err := ipmasq.NewNFT(knftables.BridgeFamily, spoofTable)
	if err != nil {
		return nil, err
	}
	return &spoofChecker{nft: r}, nil
}

// probeSpoofCheck says whether macspoofchk's table can be programmed:
// one GETGEN over netlink (STATUS).
func probeSpoofCheck() error {
	r, err := ipmasq.NewNFT(knftables.BridgeFamily, spoofTable)
	if err != nil {
		return err
	}
	return r.Close()
}

func spoofNetPrefix(network string) string { return "s-" + nft.Hash(10, network) + "-" }

func spoofChain(network, containerID, ifName string) string {
	return spoofNetPrefix(network) + nft.Hash(16, containerID, ifName)
}

func quoteIf(name string) string { return `"` + name + `"` }

func spoofBaseTx(tx *knftables.Transaction) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("flatnet CNI bridge macspoofchk")})
	tx.Add(&knftables.Map{Name: spoofMap, Type: "ifname : verdict"})
	tx.Add(&knftables.Chain{
		Name:     spoofBase,
		Type:     knftables.PtrTo(knftables.FilterType),
		Hook:     knftables.PtrTo(knftables.PreroutingHook),
		Priority: knftables.PtrTo(knftables.BaseChainPriority("-300")),
	})
	tx.Flush(&knftables.Chain{Name: spoofBase})
	tx.Add(&knftables.Rule{Chain: spoofBase, Rule: "iifname vmap @" + spoofMap})
}

func spoofAttachTx(tx *knftables.Transaction, chain, desc, port string, mac net.HardwareAddr) {
	tx.Add(&knftables.Chain{Name: chain, Comment: knftables.PtrTo(trunc(desc))})
	tx.Flush(&knftables.Chain{Name: chain})
	tx.Add(&knftables.Rule{Chain: chain, Rule: "ether saddr " + mac.String() + " return", Comment: knftables.PtrTo(trunc("mac " + mac.String()))})
	tx.Add(&knftables.Rule{Chain: chain, Rule: "drop"})
	tx.Add(&knftables.Element{Map: spoofMap, Key: []string{quoteIf(port)}, Value: []string{"goto " + chain}})
}

func trunc(s string) string {
	if len(s) > knftables.CommentLengthMax {
		return s[:knftables.CommentLengthMax]
	}
	return s
}

// Setup drops frames from port whose source MAC is not mac.
func (s *spoofChecker) Setup(ctx context.Context, network, containerID, ifName, port string, mac net.HardwareAddr) error {
	chain := spoofChain(network, containerID, ifName)
	desc := fmt.Sprintf("net: %s, if: %s, id: %s", network, ifName, containerID)
	// A stale element for a reused port name is evicted.
	evict := func() error {
		elems, err := s.elements(ctx)
		if err != nil {
			return err
		}
		stale := map[string]bool{}
		for _, e := range elems {
			if unquote(e.Key[0]) == port && nft.Target(e) != chain {
				stale[nft.Target(e)] = true
			}
		}
		return s.purge(ctx, stale, elems)
	}
	err := nft.Install(ctx, s.nft, func(tx *knftables.Transaction) { spoofAttachTx(tx, chain, desc, port, mac) }, spoofBaseTx, evict)
	if err != nil {
		return fmt.Errorf("macspoofchk: installing rules for %s in nftables table bridge %s: %w", desc, spoofTable, err)
	}
	return nil
}

func unquote(s string) string { return strings.Trim(s, `"`) }

// elements lists the port map, keys quoted as nft wants them back (the
// fake keeps them as written, nft's JSON unquotes them).
func (s *spoofChecker) elements(ctx context.Context) ([]*knftables.Element, error) {
	elems, err := s.nft.ListElements(ctx, "map", spoofMap)
	if err != nil && !nft.IsNotFound(err) {
		return nil, fmt.Errorf("macspoofchk: listing map %s: %w", spoofMap, err)
	}
	out := make([]*knftables.Element, 0, len(elems))
	for _, e := range elems {
		if len(e.Key) == 1 {
			out = append(out, &knftables.Element{Map: spoofMap, Key: []string{quoteIf(unquote(e.Key[0]))}, Value: e.Value})
		}
	}
	return out, nil
}

func (s *spoofChecker) purge(ctx context.Context, chains map[string]bool, elems []*knftables.Element) error {
	if err := nft.Purge(ctx, s.nft, chains, elems); err != nil {
		return fmt.Errorf("macspoofchk: %w", err)
	}
	return nil
}

// Teardown removes the attachment's chain and elements; nothing there is
// success.
func (s *spoofChecker) Teardown(ctx context.Context, network, containerID, ifName string) error {
	chain := spoofChain(network, containerID, ifName)
	chains, err := s.nft.List(ctx, "chain")
	if err != nil && !nft.IsNotFound(err) {
		return fmt.Errorf("macspoofchk: listing chains: %w", err)
	}
	if !slices.Contains(chains, chain) {
		return nil
	}
	elems, err := s.elements(ctx)
	if err != nil {
		return err
	}
	return s.purge(ctx, map[string]bool{chain: true}, elems)
}

// Check verifies the attachment's rules for port and mac (code 106).
func (s *spoofChecker) Check(ctx context.Context, network, containerID, ifName, port string, mac net.HardwareAddr) error {
	chain := spoofChain(network, containerID, ifName)
	var problems []string
	rules, err := s.nft.ListRules(ctx, chain)
	switch {
	case nft.IsNotFound(err):
		problems = append(problems, fmt.Sprintf("chain bridge %s %s is missing", spoofTable, chain))
	case err != nil:
		return fmt.Errorf("macspoofchk: listing rules: %w", err)
	default:
		found := false
		for _, r := range rules {
			found = found || (r.Comment != nil && *r.Comment == "mac "+mac.String())
		}
		if !found || len(rules) != 2 {
			problems = append(problems, fmt.Sprintf("chain %s does not hold the 2 rules for MAC %s", chain, mac))
		}
	}
	elems, err := s.elements(ctx)
	if err != nil {
		return err
	}
	ok := false
	for _, e := range elems {
		ok = ok || (unquote(e.Key[0]) == port && nft.Target(e) == chain)
	}
	if !ok {
		problems = append(problems, fmt.Sprintf("port %s is not sent to chain %s", port, chain))
	}
	return cnierr.Mismatch("bridge: macspoofchk", problems)
}

// GC removes the chains of network's attachments not in valid.
func (s *spoofChecker) GC(ctx context.Context, network string, valid map[[2]string]bool) error {
	chains, err := s.nft.List(ctx, "chain")
	if err != nil && !nft.IsNotFound(err) {
		return fmt.Errorf("macspoofchk: listing chains: %w", err)
	}
	keep := map[string]bool{}
	for a := range valid {
		keep[spoofChain(network, a[0], a[1])] = true
	}
	stale := map[string]bool{}
	prefix := spoofNetPrefix(network)
	for _, c := range chains {
		if strings.HasPrefix(c, prefix) && !keep[c] {
			stale[c] = true
		}
	}
	if len(stale) == 0 {
		return nil
	}
	elems, err := s.elements(ctx)
	if err != nil {
		return err
	}
	return s.purge(ctx, stale, elems)
}
