package portmap

// The nftables backend.
//
// One table, inet flatnet-portmap, holds every mapping of every network
// (inet: one transaction serves IPv4 and IPv6):
//
//	prerouting        (nat, dstnat)  fib daddr type local jump hostports
//	output            (nat, dstnat)  fib daddr type local jump hostports
//	masquerade-bitN   (nat, srcnat)  meta mark & 1<<N == 1<<N masquerade   (one per mark bit in use)
//	hostports                        jump dnat-<net>-<att>  comment "<net>-<att> ..."   (one per attachment)
//	dnat-<net>-<att>                 per mapping: mark hairpin (from the pod network) and localhost, dnat to the container
//
// Each attachment owns one chain, named from a hash of (network,
// containerID, ifname), and the jump rule(s) to it, tagged by a comment that
// starts with the same ID. ADD writes the shared skeleton in a form that is
// idempotent without reading the table (base chains are flushed and
// refilled) and creates the attachment's chain, so a new attachment costs
// one transaction (one netlink batch, see internal/nft/nfnl; one nft run on
// the text path). DEL and GC find an attachment's chain and jumps from one
// listing of the table and remove them in one transaction; DEL leaves the
// skeleton (see removeTx). Masquerade uses a packet mark, as the iptables
// backend does, so that postrouting needs no per-attachment rules. The mark
// is set for sources in the container's pod network, not just the
// container: on a bridge without br_netfilter the reply to a pod from the
// same bridge would otherwise bypass the node's conntrack (see Family.PodNet).

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
)

const (
	nftTable         = "flatnet-portmap"
	nftPrerouting    = "prerouting"
	nftOutput        = "output"
	nftMasqPrefix    = "masquerade-bit"
	nftHostports     = "hostports"
	nftChainPrefix   = "dnat-"
	nftEntryComment  = "flatnet-portmap: connections to a local address"
	nftTableComment  = "flatnet portmap: hostPort DNAT for CNI attachments"
	nftMasqCommentFm = "flatnet-portmap: masquerade mark %#x"
)

func nftChain(id ID) string { return nftChainPrefix + id.String() }

// nftAttachment is an attachment's rendered rules.
type nftAttachment struct {
	Chain string
	Rules []*knftables.Rule // the contents of Chain
	Jumps []*knftables.Rule // in hostports
}

// renderNFT renders a plan as nftables rules (pure).
func renderNFT(p *Plan) nftAttachment {
	out := nftAttachment{Chain: nftChain(p.ID)}
	mark := fmt.Sprintf("%#x", p.Mark())
	conds := false
	for _, f := range p.Families {
		conds = conds || len(f.Conditions) > 0
		ipX, proto, fam := "ip", "ipv4", "v4"
		if f.IPv6 {
			ipX, proto, fam = "ip6", "ipv6", "v6"
		}
		for _, m := range f.Mappings {
			base := []string{"meta nfproto", proto}
			dst := []string(nil)
			if restricts(m) {
				dst = []string{ipX, "daddr", m.HostIP.String()}
				base = dst
			}
			port := []string{m.Protocol, "dport", strconv.Itoa(int(m.HostPort))}
			if p.SNAT {
				var r []string
				switch {
				case p.MasqAll:
					r = concat(base, port)
				case f.IPv6:
					r = concat([]string{"ip6 saddr", nftPrefix(f.PodNet)}, dst, port)
				default:
					r = concat([]string{"ip saddr {", nftPrefix(f.PodNet) + ",", "127.0.0.1 }"}, dst, port)
				}
				out.Rules = append(out.Rules, &knftables.Rule{
					Chain:   out.Chain,
					Rule:    strings.Join(concat(r, []string{"meta mark set meta mark |", mark}), " "),
					Comment: knftables.PtrTo(nft.Comment(fam + " " + m.String() + " mark for masquerade")),
				})
			}
			to := netip.AddrPortFrom(f.ContainerIP, m.ContainerPort).String()
			out.Rules = append(out.Rules, &knftables.Rule{
				Chain:   out.Chain,
				Rule:    strings.Join(concat(base, port, []string{"dnat", ipX, "to", to}), " "),
				Comment: knftables.PtrTo(nft.Comment(fam + " " + m.String() + " dnat to " + to)),
			})
		}
	}
	if len(out.Rules) == 0 {
		return nftAttachment{}
	}
	jump := func(match []string) {
		text := strings.Join(concat(match, []string{"jump", out.Chain}), " ")
		a := p.Attachment
		// The ID tags the rule; the digest of the rule text lets ADD keep
		// an identical jump instead of replacing it.
		c := nft.Comment(fmt.Sprintf("%s %s net=%s id=%s if=%s", p.ID, hash(6, text), a.Network, a.ContainerID, a.IfName))
		out.Jumps = append(out.Jumps, &knftables.Rule{Chain: nftHostports, Rule: text, Comment: &c})
	}
	if !conds {
		jump(nil)
		return out
	}
	for _, f := range p.Families {
		proto := "ipv4"
		if f.IPv6 {
			proto = "ipv6"
		}
		jump(concat([]string{"meta nfproto", proto}, f.Conditions))
	}
	return out
}

// nftPrefix writes p as nft lists it: a lone address without "/len".
func nftPrefix(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// nftBackend applies plans with one transaction per operation.
type nftBackend struct {
	nft nft.Interface
}

func (*nftBackend) name() string { return backendNFT }

func masqComment(mark uint32) string { return fmt.Sprintf(nftMasqCommentFm, mark) }

// masqChain is the postrouting chain of one mark bit.
func masqChain(bit int) string { return nftMasqPrefix + strconv.Itoa(bit) }

func hasComment(t *nft.Table, chain, comment string) bool {
	for _, r := range t.RulesIn(chain) {
		if r.Comment != nil && *r.Comment == comment {
			return true
		}
	}
	return false
}

// jumpsOf returns the hostports rules tagged with id.
func jumpsOf(t *nft.Table, id ID) []*knftables.Rule {
	var out []*knftables.Rule
	for _, r := range t.RulesIn(nftHostports) {
		if r.Comment != nil && strings.HasPrefix(*r.Comment, id.String()+" ") {
			out = append(out, r)
		}
	}
	return out
}

func comments(rs []*knftables.Rule) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		if r.Comment != nil {
			out[i] = *r.Comment
		}
	}
	return out
}

func baseChain(name string, hook knftables.BaseChainHook, prio knftables.BaseChainPriority) *knftables.Chain {
	return &knftables.Chain{Name: name, Type: knftables.PtrTo(knftables.NATType), Hook: &hook, Priority: &prio}
}

// skeletonTx queues the shared chains and their rules. Every base chain
// is flushed and refilled: that is idempotent without reading the table,
// and atomic with the rest of the transaction. Each mark bit has its own
// postrouting chain, so a network's bit never replaces another's.
func skeletonTx(tx *knftables.Transaction, p *Plan) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo(nftTableComment)})
	tx.Add(&knftables.Chain{Name: nftHostports})
	for _, c := range []struct {
		name string
		hook knftables.BaseChainHook
	}{{nftPrerouting, knftables.PreroutingHook}, {nftOutput, knftables.OutputHook}} {
		tx.Add(baseChain(c.name, c.hook, knftables.DNATPriority))
		tx.Flush(&knftables.Chain{Name: c.name})
		tx.Add(&knftables.Rule{Chain: c.name, Rule: "fib daddr type local jump " + nftHostports, Comment: knftables.PtrTo(nftEntryComment)})
	}
	if p.SNAT {
		c := masqChain(p.MarkBit)
		mark := fmt.Sprintf("%#x", p.Mark())
		tx.Add(baseChain(c, knftables.PostroutingHook, knftables.SNATPriority))
		tx.Flush(&knftables.Chain{Name: c})
		tx.Add(&knftables.Rule{Chain: c, Rule: "meta mark & " + mark + " == " + mark + " masquerade", Comment: knftables.PtrTo(masqComment(p.Mark()))})
	}
}

// add implements backend. A new attachment costs one transaction and no read:
// `create chain` fails if the attachment's chain exists (ADD repeated, or
// the mappings changed), and only then is the table read to replace the
// attachment's jumps.
func (b *nftBackend) add(ctx context.Context, p *Plan) error {
	want := renderNFT(p)
	if len(want.Rules) > 0 {
		tx := b.nft.NewTransaction()
		skeletonTx(tx, p)
		tx.Create(&knftables.Chain{Name: want.Chain})
		for _, r := range want.Rules {
			tx.Add(r)
		}
		for _, r := range want.Jumps {
			tx.Add(r)
		}
		err := b.nft.Run(ctx, tx)
		if err == nil {
			return nil
		}
		if !nft.IsExists(err) {
			return fmt.Errorf("adding nftables rules for %s: %w", p.ID, err)
		}
	}

	cur, err := b.nft.ListTable(ctx)
	if err != nil {
		return fmt.Errorf("reading nftables table inet %s: %w", nftTable, err)
	}
	tx := b.nft.NewTransaction()
	skeletonTx(tx, p)
	// The attachment's chain is rewritten, its jumps kept if identical.
	old := jumpsOf(cur, p.ID)
	keep := len(want.Rules) > 0 && slices.Equal(comments(old), comments(want.Jumps))
	if !keep {
		for _, r := range old {
			tx.Delete(&knftables.Rule{Chain: nftHostports, Handle: r.Handle})
		}
	}
	if len(want.Rules) == 0 {
		if cur.HasChain(want.Chain) {
			tx.Flush(&knftables.Chain{Name: want.Chain})
			tx.Delete(&knftables.Chain{Name: want.Chain})
		}
	} else {
		tx.Add(&knftables.Chain{Name: want.Chain})
		tx.Flush(&knftables.Chain{Name: want.Chain})
		for _, r := range want.Rules {
			tx.Add(r)
		}
	}
	if !keep {
		for _, r := range want.Jumps {
			tx.Add(r)
		}
	}
	if err := b.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("adding nftables rules for %s: %w", p.ID, err)
	}
	return nil
}

// removeTx queues the removal of the attachments ids found in t. With
// prune, when no other attachment is left, the whole table goes too. DEL
// does not prune: deleting base chains unregisters netfilter hooks, which
// waits for an RCU grace period (20-40 ms here), and the next ADD would
// only add them back; GC and a failed ADD's undo do.
func removeTx(tx *knftables.Transaction, t *nft.Table, prune bool, ids ...ID) {
	gone := map[ID]bool{}
	for _, id := range ids {
		gone[id] = true
	}
	last := true
	for _, id := range nftIDs(t) {
		last = last && gone[id]
	}
	if prune && last {
		tx.Delete(&knftables.Table{})
		return
	}
	for _, id := range ids {
		for _, r := range jumpsOf(t, id) {
			tx.Delete(&knftables.Rule{Chain: nftHostports, Handle: r.Handle})
		}
		if c := nftChain(id); t.HasChain(c) {
			tx.Flush(&knftables.Chain{Name: c})
			tx.Delete(&knftables.Chain{Name: c})
		}
	}
}

// del implements backend.
func (b *nftBackend) del(ctx context.Context, id ID, prune bool) error {
	cur, err := b.nft.ListTable(ctx)
	if err != nil {
		return fmt.Errorf("reading nftables table inet %s: %w", nftTable, err)
	}
	if cur == nil {
		return nil
	}
	if !slices.Contains(nftIDs(cur), id) && !(prune && len(nftIDs(cur)) == 0) {
		return nil
	}
	tx := b.nft.NewTransaction()
	removeTx(tx, cur, prune, id)
	if err := b.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("removing nftables rules of %s: %w", id, err)
	}
	return nil
}

// check implements backend.
func (b *nftBackend) check(ctx context.Context, p *Plan) error {
	cur, err := b.nft.ListTable(ctx)
	if err != nil {
		return fmt.Errorf("reading nftables table inet %s: %w", nftTable, err)
	}
	if cur == nil {
		return fmt.Errorf("nftables table inet %s does not exist", nftTable)
	}
	want := renderNFT(p)
	for _, c := range []string{nftPrerouting, nftOutput} {
		if !hasComment(cur, c, nftEntryComment) {
			return fmt.Errorf("chain %s of table inet %s lacks the jump to %s", c, nftTable, nftHostports)
		}
	}
	if c := masqChain(p.MarkBit); p.SNAT && !hasComment(cur, c, masqComment(p.Mark())) {
		return fmt.Errorf("chain %s of table inet %s lacks the masquerade rule for mark %#x", c, nftTable, p.Mark())
	}
	if got, exp := comments(jumpsOf(cur, p.ID)), comments(want.Jumps); !slices.Equal(got, exp) {
		return fmt.Errorf("chain %s of table inet %s: jump rules for %s are %q, want %q", nftHostports, nftTable, p.ID, got, exp)
	}
	if len(want.Rules) > 0 && !cur.HasChain(want.Chain) {
		return fmt.Errorf("chain %s of table inet %s is missing", want.Chain, nftTable)
	}
	if got, exp := comments(cur.RulesIn(want.Chain)), comments(want.Rules); !slices.Equal(got, exp) {
		return fmt.Errorf("chain %s of table inet %s has rules %q, want %q", want.Chain, nftTable, got, exp)
	}
	return nil
}

// gc implements backend: it removes every attachment of network whose ID
// is not in valid, and the table when no attachment is left.
func (b *nftBackend) gc(ctx context.Context, network string, valid map[ID]bool) error {
	cur, err := b.nft.ListTable(ctx)
	if err != nil {
		return fmt.Errorf("reading nftables table inet %s: %w", nftTable, err)
	}
	if cur == nil {
		return nil
	}
	ids := nftIDs(cur)
	stale := staleIDs(ids, netToken(network), valid)
	if len(stale) == 0 && len(ids) > 0 {
		return nil
	}
	tx := b.nft.NewTransaction()
	removeTx(tx, cur, true, stale...)
	if err := b.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("removing stale nftables rules: %w", err)
	}
	return nil
}

// nftIDs returns the IDs of every attachment with a chain or a jump in t.
func nftIDs(t *nft.Table) []ID {
	var out []ID
	for _, c := range t.Chains {
		if id, ok := parseID(strings.TrimPrefix(c, nftChainPrefix)); ok && strings.HasPrefix(c, nftChainPrefix) {
			out = append(out, id)
		}
	}
	for _, r := range t.RulesIn(nftHostports) {
		if r.Comment == nil {
			continue
		}
		tag, _, _ := strings.Cut(*r.Comment, " ")
		if id, ok := parseID(tag); ok {
			out = append(out, id)
		}
	}
	return out
}

// parseID reads "<net>-<att>".
func parseID(s string) (ID, bool) {
	n, a, ok := strings.Cut(s, "-")
	if !ok || len(n) != 6 || len(a) != 10 {
		return ID{}, false
	}
	return ID{Net: strings.ToLower(n), Att: strings.ToLower(a)}, true
}

// staleIDs returns the IDs of network net that are not valid, once each,
// in first-seen order.
func staleIDs(ids []ID, net string, valid map[ID]bool) []ID {
	var out []ID
	seen := map[ID]bool{}
	for _, id := range ids {
		if id.Net != net || valid[id] || seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, id)
	}
	return out
}
