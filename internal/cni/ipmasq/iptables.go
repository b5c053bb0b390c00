package ipmasq

// The iptables backend, for "ipMasqBackend": "iptables" and for hosts
// without nft. Same semantics as the nftables one; per attachment and IP
// family, in the nat table:
//
//	-A POSTROUTING -s 10.1.0.5 -m comment --comment "..." -j FNMQ-<net>-<att>
//	-A FNMQ-<net>-<att> -s 10.1.0.5 -d 10.1.0.0/24 -m comment --comment "..." -j RETURN
//	-A FNMQ-<net>-<att> -d 224.0.0.0/4 -m comment --comment "..." -j RETURN
//	-A FNMQ-<net>-<att> -m comment --comment "..." -j MASQUERADE
//
// Every change is one iptables-restore --noflush input, which the kernel
// applies atomically; it is computed from an iptables-save of the nat
// table, and touches only the attachment's own chain and the jump rules
// that target it, so concurrent ADDs of different containers do not
// conflict. An IP claimed by two attachments simply has two jump rules;
// each DEL removes its own.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/nft"
)

// IPTChainName is a's chain in the nat table (at most 28 characters).
func IPTChainName(a Attachment) string {
	return IPTNetworkPrefix(a.Network) + nft.Hash(12, a.ContainerID, a.IfName)
}

// IPTNetworkPrefix starts the chain names of network's attachments.
func IPTNetworkPrefix(network string) string { return "FNMQ-" + nft.Hash(8, network) + "-" }

// IPTables is the iptables masquerade backend.
type IPTables struct {
	ipt ipt.Interface
}

// NewIPTables returns the backend over ipt (ipt.New() or ipt.NewFake()).
func NewIPTables(i ipt.Interface) *IPTables { return &IPTables{ipt: i} }

func iptComment(a Attachment) string {
	c := "flatnet ipMasq " + a.String()
	if len(c) > 256 {
		c = c[:256]
	}
	return c
}

// hostArg is an address as iptables-save prints it (with its length).
func hostArg(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// iptChainRules are the rules of a's chain for addrs of one family, in
// the form iptables-save prints them (so CHECK can compare).
func iptChainRules(a Attachment, addrs []netip.Prefix, v6 bool) [][]string {
	c := iptComment(a)
	var rules [][]string
	for _, p := range addrs {
		rules = append(rules, []string{"-s", hostArg(p.Addr()), "-d", p.Masked().String(), "-m", "comment", "--comment", c, "-j", "RETURN"})
	}
	multicast := "224.0.0.0/4"
	if v6 {
		multicast = "ff00::/8"
	}
	rules = append(rules,
		[]string{"-d", multicast, "-m", "comment", "--comment", c, "-j", "RETURN"},
		[]string{"-m", "comment", "--comment", c, "-j", "MASQUERADE"})
	return rules
}

func iptJump(a Attachment, p netip.Prefix) []string {
	return []string{"-s", hostArg(p.Addr()), "-m", "comment", "--comment", iptComment(a), "-j", IPTChainName(a)}
}

// removeChains writes into b the removal of chains and of every
// POSTROUTING rule that jumps to one of them.
func removeChains(b *ipt.Builder, t *ipt.Table, chains map[string]bool) {
	for _, r := range t.RulesIn("POSTROUTING") {
		if chains[r.Target()] {
			b.Delete("POSTROUTING", r.Args...)
		}
	}
	for c := range chains {
		if t.HasChain(c) {
			b.FlushChain(c)
			b.DeleteChain(c)
		}
	}
}

func (x *IPTables) each(addrs []netip.Prefix, fn func(proto ipt.Protocol, fam []netip.Prefix, v6 bool) error) error {
	v4, v6, err := normalize(addrs)
	if err != nil {
		return cnierr.Wrap(cnierr.InvalidConfig, err, "ipMasq")
	}
	if len(v4) > 0 {
		if err := fn(ipt.IPv4, v4, false); err != nil {
			return err
		}
	}
	if len(v6) > 0 {
		return fn(ipt.IPv6, v6, true)
	}
	return nil
}

// Setup implements Backend.
func (x *IPTables) Setup(ctx context.Context, a Attachment, addrs []netip.Prefix) error {
	chain := IPTChainName(a)
	return x.each(addrs, func(proto ipt.Protocol, fam []netip.Prefix, v6 bool) error {
		t, err := x.ipt.Save(ctx, proto, "nat")
		if err != nil {
			return fmt.Errorf("ipMasq for %s: %w", a, err)
		}
		b := ipt.NewBuilder("nat")
		for _, r := range t.RulesIn("POSTROUTING") {
			if r.Target() == chain {
				b.Delete("POSTROUTING", r.Args...) // rewritten below
			}
		}
		b.DeclareChain(chain) // created, or flushed when it exists
		for _, r := range iptChainRules(a, fam, v6) {
			b.Append(chain, r...)
		}
		for _, p := range fam {
			b.Append("POSTROUTING", iptJump(a, p)...)
		}
		if err := x.ipt.Restore(ctx, proto, b.Bytes()); err != nil {
			return fmt.Errorf("installing ipMasq rules for %s with %s: %w", a, proto, err)
		}
		return nil
	})
}

// Teardown implements Backend; addrs are not needed (the chain is found by
// name in both families).
func (x *IPTables) Teardown(ctx context.Context, a Attachment, _ []netip.Prefix) error {
	return x.collect(ctx, func(t *ipt.Table) map[string]bool {
		return map[string]bool{IPTChainName(a): true}
	})
}

// collect removes, in each family whose tools exist, the chains pick
// selects from the nat table.
func (x *IPTables) collect(ctx context.Context, pick func(*ipt.Table) map[string]bool) error {
	for _, proto := range []ipt.Protocol{ipt.IPv4, ipt.IPv6} {
		if _, real := x.ipt.(*ipt.Runner); real && ipt.Available(proto) != nil {
			continue
		}
		t, err := x.ipt.Save(ctx, proto, "nat")
		if err != nil {
			return fmt.Errorf("reading %s nat table: %w", proto, err)
		}
		b := ipt.NewBuilder("nat")
		removeChains(b, t, pick(t))
		if b.Empty() {
			continue
		}
		if err := x.ipt.Restore(ctx, proto, b.Bytes()); err != nil {
			return fmt.Errorf("removing ipMasq rules with %s: %w", proto, err)
		}
	}
	return nil
}

// Check implements Backend.
func (x *IPTables) Check(ctx context.Context, a Attachment, addrs []netip.Prefix) error {
	chain := IPTChainName(a)
	var problems []string
	err := x.each(addrs, func(proto ipt.Protocol, fam []netip.Prefix, v6 bool) error {
		t, err := x.ipt.Save(ctx, proto, "nat")
		if err != nil {
			return fmt.Errorf("reading %s nat table: %w", proto, err)
		}
		if !t.HasChain(chain) {
			problems = append(problems, fmt.Sprintf("%s chain nat %s is missing", proto, chain))
			return nil
		}
		var have [][]string
		for _, r := range t.RulesIn(chain) {
			have = append(have, r.Args)
		}
		if want := iptChainRules(a, fam, v6); !slices.EqualFunc(want, have, slices.Equal[[]string]) {
			problems = append(problems, fmt.Sprintf("%s chain nat %s holds %q, want %q", proto, chain, have, want))
		}
		for _, p := range fam {
			found := false
			for _, r := range t.RulesIn("POSTROUTING") {
				found = found || slices.Equal(r.Args, iptJump(a, p))
			}
			if !found {
				problems = append(problems, fmt.Sprintf("%s nat POSTROUTING does not send %s to %s", proto, p.Addr(), chain))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return cnierr.Mismatch("ipMasq for "+a.String(), problems)
}

// GC implements Backend.
func (x *IPTables) GC(ctx context.Context, network string, valid []Attachment) error {
	keep := map[string]bool{}
	for _, a := range valid {
		a.Network = network
		keep[IPTChainName(a)] = true
	}
	prefix := IPTNetworkPrefix(network)
	return x.collect(ctx, func(t *ipt.Table) map[string]bool {
		stale := map[string]bool{}
		for _, c := range t.Chains {
			if strings.HasPrefix(c, prefix) && !keep[c] {
				stale[c] = true
			}
		}
		return stale
	})
}
