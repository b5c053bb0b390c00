package portmap

// The iptables backend (nat table of iptables and ip6tables).
//
//	PREROUTING, OUTPUT:        -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT
//	FLATNET-HOSTPORT-DNAT:     [conditions] -m comment --comment "<id> ..." -j FLATNET-DN-<NET>-<ATT>   (one per attachment)
//	FLATNET-DN-<NET>-<ATT>:    per mapping: -s <pod network> and -s 127.0.0.1 -j FLATNET-HOSTPORT-SETMARK, -j DNAT
//	FLATNET-HOSTPORT-SETMARK:  -j MARK --set-xmark MARK/MARK   (one per mark bit in use)
//	POSTROUTING (first rule):  -j FLATNET-HOSTPORT-MASQ
//	FLATNET-HOSTPORT-MASQ:     -m mark --mark MARK/MARK -j MASQUERADE
//
// The layout is the reference plugin's, under our own chain names, so the
// two never touch each other's rules. Each operation reads the nat table
// once (iptables-save) and writes one iptables-restore --noflush input per
// IP family: the attachment's own chain is declared (which creates or
// flushes it) and refilled; shared chains are declared only when missing,
// and rules in shared and built-in chains are added only when missing and
// removed with the arguments iptables-save printed. Our own rules are
// written in iptables-save's canonical form, so CHECK compares them as text.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/flatnet/flatnet/internal/ipt"
)

const (
	iptTopDNAT     = "FLATNET-HOSTPORT-DNAT"
	iptSetMark     = "FLATNET-HOSTPORT-SETMARK"
	iptMasq        = "FLATNET-HOSTPORT-MASQ"
	iptChainPrefix = "FLATNET-DN-"
	iptNAT         = "nat"
)

var (
	iptEntryArgs    = []string{"-m", "comment", "--comment", "flatnet-portmap: connections to a local address", "-m", "addrtype", "--dst-type", "LOCAL", "-j", iptTopDNAT}
	iptPostroutArgs = []string{"-m", "comment", "--comment", "flatnet-portmap: masquerade marked hostport connections", "-j", iptMasq}
)

func iptChain(id ID) string {
	return iptChainPrefix + strings.ToUpper(id.Net) + "-" + strings.ToUpper(id.Att)
}

// iptFamily is an attachment's rendered rules for one IP family.
type iptFamily struct {
	Proto ipt.Protocol
	Chain string
	Rules [][]string // the contents of Chain, in canonical save form
	Jump  []string   // the rule in FLATNET-HOSTPORT-DNAT
}

func prefix(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// renderIPT renders a plan as iptables rules (pure).
func renderIPT(p *Plan) []iptFamily {
	var out []iptFamily
	chain := iptChain(p.ID)
	setMark := iptSetMark
	if p.SetMarkChain != "" {
		setMark = p.SetMarkChain
	}
	for _, f := range p.Families {
		fam := iptFamily{Proto: ipt.IPv4, Chain: chain}
		if f.IPv6 {
			fam.Proto = ipt.IPv6
		}
		for _, m := range f.Mappings {
			var dst []string
			if restricts(m) {
				dst = []string{"-d", prefix(m.HostIP)}
			}
			port := []string{"-p", m.Protocol, "-m", m.Protocol, "--dport", strconv.Itoa(int(m.HostPort))}
			if p.SNAT {
				var sources [][]string
				switch {
				case p.MasqAll:
					sources = [][]string{nil}
				case f.IPv6:
					sources = [][]string{{"-s", f.PodNet.String()}}
				default:
					sources = [][]string{{"-s", f.PodNet.String()}, {"-s", "127.0.0.1/32"}}
				}
				for _, s := range sources {
					fam.Rules = append(fam.Rules, concat(s, dst, port, []string{"-j", setMark}))
				}
			}
			to := netip.AddrPortFrom(f.ContainerIP, m.ContainerPort).String()
			fam.Rules = append(fam.Rules, concat(dst, port, []string{"-j", "DNAT", "--to-destination", to}))
		}
		a := p.Attachment
		comment := iptComment(fmt.Sprintf("%s net=%s id=%s if=%s", p.ID, a.Network, a.ContainerID, a.IfName))
		fam.Jump = concat(f.Conditions, []string{"-m", "comment", "--comment", comment, "-j", chain})
		out = append(out, fam)
	}
	return out
}

// iptComment keeps a comment printable and within iptables' 255 bytes.
func iptComment(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			b[i] = '_'
		}
	}
	if len(b) > 255 {
		b = b[:255]
	}
	return string(b)
}

func markDef(mark uint32) string { return fmt.Sprintf("%#x/%#x", mark, mark) }

func hasTarget(t *ipt.Table, chain, target string) bool {
	return slices.ContainsFunc(t.RulesIn(chain), func(r ipt.Rule) bool { return r.Target() == target })
}

// hasArg reports whether a rule of chain has flag followed by value.
func hasArg(t *ipt.Table, chain, flag, value string) bool {
	for _, r := range t.RulesIn(chain) {
		for i := 0; i+1 < len(r.Args); i++ {
			if r.Args[i] == flag && r.Args[i+1] == value {
				return true
			}
		}
	}
	return false
}

func jumpsTo(t *ipt.Table, chain string) []ipt.Rule {
	var out []ipt.Rule
	for _, r := range t.RulesIn(iptTopDNAT) {
		if r.Target() == chain {
			out = append(out, r)
		}
	}
	return out
}

// iptBackend applies plans with iptables-restore.
type iptBackend struct {
	ipt ipt.Interface
	// protos are the families whose binaries are installed.
	protos []ipt.Protocol
}

func (*iptBackend) name() string { return backendIPT }

func (b *iptBackend) has(proto ipt.Protocol) bool { return slices.Contains(b.protos, proto) }

// add implements backend.
func (b *iptBackend) add(ctx context.Context, p *Plan) error {
	for _, fam := range renderIPT(p) {
		if !b.has(fam.Proto) {
			return fmt.Errorf("%w: %s is needed for the %s mappings", ipt.ErrNoIPTables, fam.Proto, p.ID)
		}
		t, err := b.ipt.Save(ctx, fam.Proto, iptNAT)
		if err != nil {
			return fmt.Errorf("reading the %s nat table: %w", fam.Proto, err)
		}
		w := ipt.NewBuilder(iptNAT)
		if !t.HasChain(iptTopDNAT) {
			w.DeclareChain(iptTopDNAT)
		}
		for _, c := range []string{"PREROUTING", "OUTPUT"} {
			if !hasTarget(t, c, iptTopDNAT) {
				w.Append(c, iptEntryArgs...)
			}
		}
		if p.SNAT && p.SetMarkChain == "" {
			def := markDef(p.Mark())
			if !t.HasChain(iptSetMark) {
				w.DeclareChain(iptSetMark)
			}
			if !hasArg(t, iptSetMark, "--set-xmark", def) {
				w.Append(iptSetMark, "-m", "comment", "--comment", "flatnet-portmap: mark for masquerade", "-j", "MARK", "--set-xmark", def)
			}
			if !t.HasChain(iptMasq) {
				w.DeclareChain(iptMasq)
			}
			if !hasArg(t, iptMasq, "--mark", def) {
				w.Append(iptMasq, "-m", "mark", "--mark", def, "-j", "MASQUERADE")
			}
			if !hasTarget(t, "POSTROUTING", iptMasq) {
				w.Insert("POSTROUTING", 1, iptPostroutArgs...)
			}
		}
		old := jumpsTo(t, fam.Chain)
		keep := len(old) == 1 && slices.Equal(old[0].Args, fam.Jump)
		if !keep {
			for _, r := range old {
				w.Delete(iptTopDNAT, r.Args...)
			}
		}
		w.DeclareChain(fam.Chain)
		for _, r := range fam.Rules {
			w.Append(fam.Chain, r...)
		}
		if !keep {
			w.Append(iptTopDNAT, fam.Jump...)
		}
		if err := b.ipt.Restore(ctx, fam.Proto, w.Bytes()); err != nil {
			return fmt.Errorf("adding %s rules for %s: %w", fam.Proto, p.ID, err)
		}
	}
	return nil
}

// removeChains queues the removal of attachment chains and the jumps to
// them. With prune, when no other attachment chain is left, our shared
// chains and the jumps from built-in chains go too (GC, a failed ADD's
// undo); DEL leaves them for the next ADD, as for nftables.
func removeChains(w *ipt.Builder, t *ipt.Table, prune bool, chains ...string) {
	last := prune
	for _, c := range t.Chains {
		if strings.HasPrefix(c, iptChainPrefix) && !slices.Contains(chains, c) {
			last = false
		}
	}
	for _, r := range t.RulesIn(iptTopDNAT) {
		if !slices.Contains(chains, r.Target()) {
			last = false
		}
	}
	var flush []string
	for _, c := range chains {
		if !t.HasChain(c) {
			continue
		}
		for _, r := range jumpsTo(t, c) {
			w.Delete(iptTopDNAT, r.Args...)
		}
		flush = append(flush, c)
	}
	if last {
		for _, j := range []struct{ chain, target string }{
			{"PREROUTING", iptTopDNAT}, {"OUTPUT", iptTopDNAT}, {"POSTROUTING", iptMasq},
		} {
			for _, r := range t.RulesIn(j.chain) {
				if r.Target() == j.target {
					w.Delete(j.chain, r.Args...)
				}
			}
		}
		for _, c := range []string{iptTopDNAT, iptMasq, iptSetMark} {
			if t.HasChain(c) {
				flush = append(flush, c)
			}
		}
	}
	for _, c := range flush {
		w.FlushChain(c)
	}
	for _, c := range flush {
		w.DeleteChain(c)
	}
}

// del implements backend.
func (b *iptBackend) del(ctx context.Context, id ID, prune bool) error {
	chain := iptChain(id)
	var errs []error
	for _, proto := range b.protos {
		t, err := b.ipt.Save(ctx, proto, iptNAT)
		if err != nil {
			errs = append(errs, fmt.Errorf("reading the %s nat table: %w", proto, err))
			continue
		}
		if !t.HasChain(chain) && !(prune && t.HasChain(iptTopDNAT)) {
			continue
		}
		w := ipt.NewBuilder(iptNAT)
		removeChains(w, t, prune, chain)
		if w.Empty() {
			continue
		}
		if err := b.ipt.Restore(ctx, proto, w.Bytes()); err != nil {
			errs = append(errs, fmt.Errorf("removing %s rules of %s: %w", proto, id, err))
		}
	}
	return errors.Join(errs...)
}

// check implements backend.
func (b *iptBackend) check(ctx context.Context, p *Plan) error {
	for _, fam := range renderIPT(p) {
		if !b.has(fam.Proto) {
			return fmt.Errorf("%w: %s", ipt.ErrNoIPTables, fam.Proto)
		}
		t, err := b.ipt.Save(ctx, fam.Proto, iptNAT)
		if err != nil {
			return fmt.Errorf("reading the %s nat table: %w", fam.Proto, err)
		}
		for _, c := range []string{"PREROUTING", "OUTPUT"} {
			if !hasTarget(t, c, iptTopDNAT) {
				return fmt.Errorf("%s nat chain %s lacks the jump to %s", fam.Proto, c, iptTopDNAT)
			}
		}
		if p.SNAT && p.SetMarkChain == "" {
			def := markDef(p.Mark())
			if !hasTarget(t, "POSTROUTING", iptMasq) || !hasArg(t, iptMasq, "--mark", def) || !hasArg(t, iptSetMark, "--set-xmark", def) {
				return fmt.Errorf("%s nat table lacks the masquerade rules for mark %s (%s, %s)", fam.Proto, def, iptMasq, iptSetMark)
			}
		}
		if !t.HasChain(fam.Chain) {
			return fmt.Errorf("%s nat chain %s is missing", fam.Proto, fam.Chain)
		}
		if n := len(jumpsTo(t, fam.Chain)); n != 1 {
			return fmt.Errorf("%s nat chain %s has %d jumps to %s, want 1", fam.Proto, iptTopDNAT, n, fam.Chain)
		}
		got := t.RulesIn(fam.Chain)
		same := len(got) == len(fam.Rules)
		for i := 0; same && i < len(got); i++ {
			same = slices.Equal(got[i].Args, fam.Rules[i])
		}
		if !same {
			var lines []string
			for _, r := range got {
				lines = append(lines, strings.Join(r.Args, " "))
			}
			return fmt.Errorf("%s nat chain %s has rules %q, want %q", fam.Proto, fam.Chain, lines, joinAll(fam.Rules))
		}
	}
	return nil
}

func joinAll(rs [][]string) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = strings.Join(r, " ")
	}
	return out
}

// gc implements backend.
func (b *iptBackend) gc(ctx context.Context, network string, valid map[ID]bool) error {
	var errs []error
	net := netToken(network)
	for _, proto := range b.protos {
		t, err := b.ipt.Save(ctx, proto, iptNAT)
		if err != nil {
			errs = append(errs, fmt.Errorf("reading the %s nat table: %w", proto, err))
			continue
		}
		var ids []ID
		for _, c := range t.Chains {
			if id, ok := parseID(strings.TrimPrefix(c, iptChainPrefix)); ok && strings.HasPrefix(c, iptChainPrefix) {
				ids = append(ids, id)
			}
		}
		stale := staleIDs(ids, net, valid)
		if len(stale) == 0 && len(ids) > 0 {
			continue
		}
		var chains []string
		for _, id := range stale {
			chains = append(chains, iptChain(id))
		}
		w := ipt.NewBuilder(iptNAT)
		removeChains(w, t, true, chains...)
		if w.Empty() {
			continue
		}
		if err := b.ipt.Restore(ctx, proto, w.Bytes()); err != nil {
			errs = append(errs, fmt.Errorf("removing stale %s rules: %w", proto, err))
		}
	}
	return errors.Join(errs...)
}
