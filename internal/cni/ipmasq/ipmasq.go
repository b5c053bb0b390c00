// Package ipmasq masquerades traffic that leaves a container's subnet, for
// the bridge and ptp plugins' "ipMasq" option, with nftables.
//
// Semantics are the reference plugins' (pkg/ip/ipmasq_linux.go there):
// traffic from a container IP to any destination outside that IP's subnet
// is masqueraded, except multicast.
//
// Two backends implement Backend: nftables (this file; the default, used
// when nf_tables answers over netlink) and iptables (iptables.go; for
// "ipMasqBackend": "iptables", or when nf_tables does not answer and
// iptables is installed). Select picks one; Start, TeardownIfAny,
// CheckWith and GCAll are what the plugins call. nftables is programmed
// over netlink from inside the plugin (internal/nft/nfnl: no nft process;
// the nft binary only for a transaction nfnl does not compile, which none
// of ours is); NewNFT sets it up for CNI use, with one GETGEN as its probe
// (code 105 when nf_tables does not answer or lacks a feature).
//
// nftables layout: one table, inet flatnet-cni-masq:
//
//	map masq4 { type ipv4_addr : verdict }   container IPv4 -> goto <attachment chain>
//	map masq6 { type ipv6_addr : verdict }   container IPv6 -> goto <attachment chain>
//	chain postrouting (nat, srcnat):
//	    ip daddr 224.0.0.0/4 return
//	    ip6 daddr ff00::/8 return
//	    ip saddr vmap @masq4
//	    ip6 saddr vmap @masq6
//	chain m-<network hash>-<attachment hash>:       one per attachment
//	    ip saddr 10.1.0.5 ip daddr != 10.1.0.0/24 masquerade comment "10.1.0.5; net: ..."
//
// Why this shape:
//   - ADD is one transaction (one netlink batch) that only adds (a
//     chain, its rules, map elements) and never deletes or reads. nf_tables waits for an RCU
//     grace period (~10-15 ms) on transactions that delete anything or
//     abort, so ADD must not flush a non-empty chain or delete a rule.
//     The base chain is written once, when the first ADD finds the table
//     missing (the transaction fails with ENOENT, we create the table and
//     retry).
//   - Attachments are found by name: the chain name is a hash of (network)
//     and of (container ID, ifname), so DEL, CHECK and GC never need rule
//     handles, and GC lists a network's attachments by chain-name prefix.
//   - Concurrent ADDs and DELs of different containers touch disjoint
//     objects, each in one atomic transaction: no read-modify-write.
//   - A map key is an IP, which two attachments can claim when an IP was
//     released and handed out again before the old attachment was deleted.
//     The kernel refuses to overwrite a map element with a different
//     verdict (EEXIST) and to delete a chain a map still points to
//     (EBUSY). ADD uses the first: on EEXIST it evicts the stale attachment
//     (its chain and all its elements) and retries; the stale attachment's
//     later DEL then finds its chain gone and deletes nothing. DEL
//     deletes its elements and chain in one transaction, and falls back to
//     reading the table (which elements point at my chain?) when that
//     transaction fails, so it never removes an element it does not own.
//
// nft.Install and nft.Purge (internal/nft/attach.go) implement the add-only
// ADD and the one-transaction removal; bridge's macspoofchk uses them too.
package ipmasq

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"syscall"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/nft/nfnl"
)

const (
	// Table is the nftables table (family inet) that holds every rule of
	// this package.
	Table = "flatnet-cni-masq"
	// BaseChain hooks postrouting and dispatches on the source address.
	BaseChain = "postrouting"
	map4      = "masq4"
	map6      = "masq6"
	// chainPrefix starts every attachment chain's name.
	chainPrefix = "m-"
)

// Attachment identifies one container attachment.
type Attachment struct {
	Network     string
	ContainerID string
	IfName      string
}

func (a Attachment) String() string {
	return fmt.Sprintf("net: %s, if: %s, id: %s", a.Network, a.IfName, a.ContainerID)
}

// NetworkPrefix is the chain-name prefix shared by every attachment of
// network.
func NetworkPrefix(network string) string {
	return chainPrefix + nft.Hash(10, network) + "-"
}

// ChainName is the name of a's chain.
func ChainName(a Attachment) string {
	return NetworkPrefix(a.Network) + nft.Hash(16, a.ContainerID, a.IfName)
}

// Masq manages the masquerade rules through an nftables interface.
type Masq struct {
	nft knftables.Interface
}

// New returns a Masq over nft, which must be bound to family inet and
// table Table (knftables.NewFake(knftables.InetFamily, ipmasq.Table) in
// tests).
func New(n knftables.Interface) *Masq { return &Masq{nft: n} }

// NewNFT returns the nftables table family/table as the CNI plugins
// (ipMasq, bridge's macspoofchk, portmap) use it: programmed over netlink
// in the caller's network namespace, with the nft binary (looked up only
// then) for a transaction the netlink compiler does not cover. It probes
// nf_tables with one GETGEN (no kernel transaction, no process): code 105
// when nf_tables does not answer; a kernel refusal "not supported" later
// gets code 105 too (Classify).
func NewNFT(family knftables.Family, table string) (*nfnl.Runner, error) {
	r := nfnl.New(family, table, nfnl.Options{
		Classify: Classify,
		Fallback: nfnl.ExecFallback(family, table, Classify, nft.StandardPaths...),
	})
	if err := r.Probe(context.Background()); err != nil {
		_ = r.Close()
		if _, ok := cnierr.Code(err); ok {
			return nil, err
		}
		return nil, cnierr.Wrap(cnierr.KernelFeatureMissing, err,
			"nftables is not available over netlink (is the nf_tables module loaded? modprobe nf_tables)")
	}
	return r, nil
}

// Classify gives the kernel's "not supported" code 105 (a missing module
// or feature), for nft.Runner and nfnl.Runner alike; other failures stay
// as reported (so nft.IsNotFound still works).
func Classify(e *nft.Error) error {
	switch e.Errno {
	case syscall.EOPNOTSUPP, syscall.EPROTONOSUPPORT, syscall.EAFNOSUPPORT:
		return cnierr.Wrap(cnierr.KernelFeatureMissing, e, "the kernel lacks an nftables feature (nf_tables, nft_nat, nft_masq, nft_fib?)")
	}
	return e
}

// IsUnavailable reports whether err is NewNFT's or Select's "nftables (or
// iptables) is not available": there can be no rules of ours to remove.
func IsUnavailable(err error) bool {
	code, ok := cnierr.Code(err)
	return ok && code == cnierr.KernelFeatureMissing
}

// NewDefault returns a Masq programmed over netlink (code 105 when
// nf_tables does not answer).
func NewDefault() (*Masq, error) {
	r, err := NewNFT(knftables.InetFamily, Table)
	if err != nil {
		return nil, err
	}
	return New(r), nil
}

// normalize validates addrs (container IP with its subnet's prefix length)
// and splits them by family.
func normalize(addrs []netip.Prefix) (v4, v6 []netip.Prefix, err error) {
	for _, p := range addrs {
		if !p.IsValid() {
			return nil, nil, fmt.Errorf("invalid address %v", p)
		}
		a := p.Addr().Unmap()
		bits := p.Bits()
		if p.Addr().Is4In6() {
			bits -= 96
		}
		q := netip.PrefixFrom(a, bits)
		if a.Is4() {
			v4 = append(v4, q)
		} else {
			v6 = append(v6, q)
		}
	}
	return v4, v6, nil
}

func comment(s string) *string {
	if len(s) > knftables.CommentLengthMax {
		s = s[:knftables.CommentLengthMax]
	}
	return &s
}

// ruleComment tags the rule for one address; CHECK looks rules up by it.
func ruleComment(a Attachment, addr netip.Addr) *string {
	return comment(addr.String() + "; " + a.String())
}

// addBase writes the table, the maps and the base chain with its rules.
// Idempotent: the base chain is flushed and rewritten.
func addBase(tx *knftables.Transaction) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("flatnet CNI ipMasq: masquerade container traffic leaving its subnet")})
	tx.Add(&knftables.Map{Name: map4, Type: "ipv4_addr : verdict"})
	tx.Add(&knftables.Map{Name: map6, Type: "ipv6_addr : verdict"})
	tx.Add(&knftables.Chain{
		Name:     BaseChain,
		Type:     knftables.PtrTo(knftables.NATType),
		Hook:     knftables.PtrTo(knftables.PostroutingHook),
		Priority: knftables.PtrTo(knftables.SNATPriority),
	})
	tx.Flush(&knftables.Chain{Name: BaseChain})
	for _, r := range baseRules {
		tx.Add(&knftables.Rule{Chain: BaseChain, Rule: r})
	}
}

var baseRules = []string{
	"ip daddr 224.0.0.0/4 return",
	"ip6 daddr ff00::/8 return",
	"ip saddr vmap @" + map4,
	"ip6 saddr vmap @" + map6,
}

// addAttachment writes a's chain, its rules and its map elements.
func addAttachment(tx *knftables.Transaction, a Attachment, v4, v6 []netip.Prefix) {
	chain := ChainName(a)
	tx.Add(&knftables.Chain{Name: chain, Comment: comment(a.String())})
	// Flushing the chain we just created is free; it matters only when
	// ADD runs again for the same attachment.
	tx.Flush(&knftables.Chain{Name: chain})
	for _, fam := range []struct {
		ip    string
		m     string
		addrs []netip.Prefix
	}{{"ip", map4, v4}, {"ip6", map6, v6}} {
		for _, p := range fam.addrs {
			tx.Add(&knftables.Rule{
				Chain: chain,
				Rule: knftables.Concat(
					fam.ip, "saddr", p.Addr(),
					fam.ip, "daddr", "!=", p.Masked(),
					"masquerade",
				),
				Comment: ruleComment(a, p.Addr()),
			})
			tx.Add(&knftables.Element{Map: fam.m, Key: []string{p.Addr().String()}, Value: []string{"goto " + chain}})
		}
	}
}

// Setup installs a's masquerade rules for addrs (each container IP with the
// prefix length of its subnet). Running it twice gives the same ruleset.
func (m *Masq) Setup(ctx context.Context, a Attachment, addrs []netip.Prefix) error {
	v4, v6, err := normalize(addrs)
	if err != nil {
		return cnierr.Wrap(cnierr.InvalidConfig, err, "ipMasq for %s", a)
	}
	if len(v4)+len(v6) == 0 {
		return nil
	}
	// The base is written when the table is missing: first use in this
	// namespace (or someone deleted our table).
	err = nft.Install(ctx, m.nft,
		func(tx *knftables.Transaction) { addAttachment(tx, a, v4, v6) },
		addBase,
		func() error { return m.evict(ctx, a, v4, v6) })
	if err != nil {
		return fmt.Errorf("installing ipMasq rules for %s in nftables table inet %s: %w", a, Table, err)
	}
	return nil
}

func (m *Masq) ensureBase(ctx context.Context) error {
	tx := m.nft.NewTransaction()
	addBase(tx)
	if err := m.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("creating nftables table inet %s: %w", Table, err)
	}
	return nil
}

// evict removes the attachments that own any of a's addresses as map keys:
// the addresses were handed out again, so those attachments are stale.
func (m *Masq) evict(ctx context.Context, a Attachment, v4, v6 []netip.Prefix) error {
	mine := ChainName(a)
	elems, err := m.elements(ctx)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, p := range append(append([]netip.Prefix{}, v4...), v6...) {
		want[p.Addr().String()] = true
	}
	stale := map[string]bool{}
	for _, e := range elems {
		if c := nft.Target(e); want[e.Key[0]] && c != "" && c != mine {
			stale[c] = true
		}
	}
	return m.purge(ctx, stale, elems)
}

// elements lists both maps (missing maps are empty).
func (m *Masq) elements(ctx context.Context) ([]*knftables.Element, error) {
	var all []*knftables.Element
	for _, name := range []string{map4, map6} {
		es, err := m.nft.ListElements(ctx, "map", name)
		if err != nil {
			if nft.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("listing nftables map %s in inet %s: %w", name, Table, err)
		}
		all = append(all, es...)
	}
	return all, nil
}

// purge deletes chains and every map element pointing to them, in one
// transaction. elems is the current content of both maps.
func (m *Masq) purge(ctx context.Context, chains map[string]bool, elems []*knftables.Element) error {
	if err := nft.Purge(ctx, m.nft, chains, elems); err != nil {
		return fmt.Errorf("ipMasq in nftables table inet %s: %w", Table, err)
	}
	return nil
}

// Teardown removes a's rules. addrs are the addresses Setup was given, if
// known (they let DEL finish in one transaction); with nil addrs, or when
// that transaction fails, Teardown reads the table to find what a owns.
// Nothing to remove is success.
func (m *Masq) Teardown(ctx context.Context, a Attachment, addrs []netip.Prefix) error {
	chain := ChainName(a)
	v4, v6, err := normalize(addrs)
	if err == nil && len(v4)+len(v6) > 0 {
		tx := m.nft.NewTransaction()
		for _, p := range v4 {
			tx.Delete(&knftables.Element{Map: map4, Key: []string{p.Addr().String()}})
		}
		for _, p := range v6 {
			tx.Delete(&knftables.Element{Map: map6, Key: []string{p.Addr().String()}})
		}
		tx.Flush(&knftables.Chain{Name: chain})
		tx.Delete(&knftables.Chain{Name: chain})
		if m.nft.Run(ctx, tx) == nil {
			return nil
		}
		// Something differs from what we expected (already gone, an
		// address not ours, an extra element): read and remove exactly ours.
	}
	chains, err := m.nft.List(ctx, "chain")
	if err != nil {
		if nft.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("listing chains of inet %s: %w", Table, err)
	}
	if !slices.Contains(chains, chain) {
		// Elements only ever point to existing chains: nothing is ours.
		return nil
	}
	elems, err := m.elements(ctx)
	if err != nil {
		return err
	}
	return m.purge(ctx, map[string]bool{chain: true}, elems)
}

// Check verifies that a's rules and map elements are installed for
// addrs. The error (code 106) lists everything that differs.
func (m *Masq) Check(ctx context.Context, a Attachment, addrs []netip.Prefix) error {
	v4, v6, err := normalize(addrs)
	if err != nil {
		return cnierr.Wrap(cnierr.InvalidConfig, err, "ipMasq for %s", a)
	}
	chain := ChainName(a)
	var problems []string
	base, err := m.nft.ListRules(ctx, BaseChain)
	switch {
	case nft.IsNotFound(err):
		problems = append(problems, fmt.Sprintf("nftables chain inet %s %s is missing", Table, BaseChain))
	case err != nil:
		return fmt.Errorf("listing inet %s %s: %w", Table, BaseChain, err)
	case len(base) != len(baseRules):
		problems = append(problems, fmt.Sprintf("nftables chain inet %s %s has %d rules, want %d", Table, BaseChain, len(base), len(baseRules)))
	}
	rules, err := m.nft.ListRules(ctx, chain)
	if err != nil && !nft.IsNotFound(err) {
		return fmt.Errorf("listing inet %s %s: %w", Table, chain, err)
	}
	if err != nil {
		problems = append(problems, fmt.Sprintf("nftables chain inet %s %s for %s is missing", Table, chain, a))
	}
	comments := map[string]bool{}
	for _, r := range rules {
		if r.Comment != nil {
			comments[*r.Comment] = true
		}
	}
	elems, err := m.elements(ctx)
	if err != nil {
		return err
	}
	byKey := map[string]string{}
	for _, e := range elems {
		if len(e.Key) == 1 {
			byKey[e.Map+" "+e.Key[0]] = nft.Target(e)
		}
	}
	for _, fam := range []struct {
		m     string
		addrs []netip.Prefix
	}{{map4, v4}, {map6, v6}} {
		for _, p := range fam.addrs {
			ip := p.Addr().String()
			if err == nil && !comments[*ruleComment(a, p.Addr())] {
				problems = append(problems, fmt.Sprintf("no masquerade rule for %s in chain %s", ip, chain))
			}
			switch got, ok := byKey[fam.m+" "+ip]; {
			case !ok:
				problems = append(problems, fmt.Sprintf("map %s has no element for %s", fam.m, ip))
			case got != chain:
				problems = append(problems, fmt.Sprintf("map %s sends %s to %q, want %q", fam.m, ip, got, chain))
			}
		}
	}
	if err == nil && len(rules) != len(v4)+len(v6) {
		problems = append(problems, fmt.Sprintf("chain %s has %d rules, want %d", chain, len(rules), len(v4)+len(v6)))
	}
	return cnierr.Mismatch("ipMasq for "+a.String(), problems)
}

// Attachments returns the chain names of network's attachments.
func (m *Masq) Attachments(ctx context.Context, network string) ([]string, error) {
	chains, err := m.nft.List(ctx, "chain")
	if err != nil {
		if nft.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing chains of inet %s: %w", Table, err)
	}
	var out []string
	prefix := NetworkPrefix(network)
	for _, c := range chains {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	sort.Strings(out)
	return out, nil
}

// GC removes the rules of every attachment of network that is not in
// valid. It also rewrites the base chain when the table exists, so a
// damaged base chain is repaired.
func (m *Masq) GC(ctx context.Context, network string, valid []Attachment) error {
	have, err := m.Attachments(ctx, network)
	if err != nil || len(have) == 0 {
		return err
	}
	keep := map[string]bool{}
	for _, a := range valid {
		a.Network = network
		keep[ChainName(a)] = true
	}
	stale := map[string]bool{}
	for _, c := range have {
		if !keep[c] {
			stale[c] = true
		}
	}
	if err := m.ensureBase(ctx); err != nil {
		return err
	}
	if len(stale) == 0 {
		return nil
	}
	elems, err := m.elements(ctx)
	if err != nil {
		return err
	}
	return m.purge(ctx, stale, elems)
}

// Backend installs, removes, checks and collects masquerade rules. *Masq
// (nftables) and *IPTables implement it.
type Backend interface {
	Setup(ctx context.Context, a Attachment, addrs []netip.Prefix) error
	Teardown(ctx context.Context, a Attachment, addrs []netip.Prefix) error
	Check(ctx context.Context, a Attachment, addrs []netip.Prefix) error
	GC(ctx context.Context, network string, valid []Attachment) error
}

// Select returns the backend for a config's "ipMasqBackend": "nftables",
// "iptables", or unset: nftables when nf_tables answers, else iptables.
// (The reference prefers iptables when both exist; nftables is ours
// because it needs no read before a write and is faster.) Missing tools
// give code 105.
func Select(backend *string) (Backend, error) {
	want := ""
	if backend != nil {
		want = *backend
	}
	switch want {
	case "nftables":
		return NewDefault()
	case "iptables":
		if err := errors.Join(ipt.Available(ipt.IPv4), ipt.Available(ipt.IPv6)); err != nil {
			return nil, cnierr.Wrap(cnierr.KernelFeatureMissing, err, `"ipMasqBackend": "iptables"`)
		}
		return NewIPTables(ipt.New()), nil
	case "":
		m, err := NewDefault()
		if err == nil {
			return m, nil
		}
		if ipt.Available(ipt.IPv4) == nil && ipt.Available(ipt.IPv6) == nil {
			return NewIPTables(ipt.New()), nil
		}
		return nil, cnierr.Wrap(cnierr.KernelFeatureMissing, err,
			"ipMasq needs nftables or iptables: nf_tables does not answer over netlink and iptables-save/iptables-restore are not installed")
	}
	return nil, cnierr.New(cnierr.InvalidConfig, `"ipMasqBackend": unknown backend %q (want "nftables" or "iptables")`, want)
}

// Start installs a's rules in the background, so that the kernel
// transactions run while the caller configures interfaces. wait returns Setup's
// result; undo waits for it and removes whatever was installed (for a
// failed ADD).
func Start(ctx context.Context, backend *string, a Attachment, addrs []netip.Prefix) (wait, undo func() error) {
	b, err := Select(backend)
	if err != nil {
		return func() error { return err }, func() error { return nil }
	}
	done := make(chan struct{})
	var setupErr error
	go func() {
		defer close(done)
		setupErr = b.Setup(ctx, a, addrs)
	}()
	wait = func() error {
		<-done
		return setupErr
	}
	undo = func() error {
		<-done
		return b.Teardown(ctx, a, addrs)
	}
	return wait, undo
}

// TeardownIfAny removes a's rules with the configured backend; when its
// tools are not installed there can be no rules.
func TeardownIfAny(ctx context.Context, backend *string, a Attachment, addrs []netip.Prefix) error {
	b, err := Select(backend)
	if IsUnavailable(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return b.Teardown(ctx, a, addrs)
}

// CheckWith verifies a's rules with the configured backend.
func CheckWith(ctx context.Context, backend *string, a Attachment, addrs []netip.Prefix) error {
	b, err := Select(backend)
	if err != nil {
		return err
	}
	return b.Check(ctx, a, addrs)
}

// GCAll collects network's stale attachments in nftables (when nf_tables
// answers) and in iptables (when the config asks for it or nftables is
// not available). required: the config uses ipMasq, so having neither tool is
// an error (code 105).
func GCAll(ctx context.Context, backend *string, required bool, network string, valid []Attachment) error {
	ran := false
	if m, err := NewDefault(); err == nil {
		if err := m.GC(ctx, network, valid); err != nil {
			return err
		}
		ran = true
	}
	if (backend != nil && *backend == "iptables") || !ran {
		if ipt.Available(ipt.IPv4) == nil || ipt.Available(ipt.IPv6) == nil {
			if err := NewIPTables(ipt.New()).GC(ctx, network, valid); err != nil {
				return err
			}
			ran = true
		}
	}
	if !ran && required {
		_, err := Select(backend)
		return err
	}
	return nil
}
