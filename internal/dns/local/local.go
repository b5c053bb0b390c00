// Package local takes the cluster DNS addresses on the node: the node-local
// address (169.254.20.10, the NodeLocal DNSCache convention) and the
// kube-dns Service's ClusterIP, so that unmodified pods reach the agent's
// DNS server on this node, with nothing tracked on the way.
//
// Design. Two pieces of kernel state, computed from the address list:
//
//   - each address on the loopback device (/32 or /128). IPv4 ones carry the
//     label lo:flatnetdns, so a restarted agent knows which are its own;
//     IPv6 addresses cannot carry a label, so only those added by this
//     process are removed (a crashed agent's stay until the node's next
//     boot: harmless, nothing else answers on them). A
//     packet from a pod to one of them is delivered locally, to the server's
//     socket bound to it, instead of being routed (NodeLocal DNSCache puts
//     them on a dummy device; this kernel may lack the dummy driver, and lo
//     is always there);
//
//   - one nftables table, inet flatnet-dns, with raw-priority chains that
//     mark DNS packets to and from those addresses notrack:
//
//     table inet flatnet-dns
//     chain prerouting (filter hook prerouting priority raw)
//     chain output     (filter hook output priority raw)
//     both: ip daddr @dns4 udp dport 53 notrack, ... tcp ..., and the
//     replies' ip saddr @dns4 udp sport 53 notrack, ... (ip6 likewise)
//
// Untracked packets skip every nat chain (so the Service proxy's DNAT of the
// kube-dns ClusterIP, kube-proxy's included, never sees them) and match no
// "ct state new" rule (so a proxy's reject for a Service without endpoints
// does not either). No conntrack entry means no conntrack insert race on
// parallel A+AAAA queries over UDP (kubernetes#56903), and no table to
// fill. Sync is idempotent: it writes the table only when its rule
// comments differ from the desired ones. Remove undoes both.
package local

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
)

const (
	// Table is the nftables table (family inet).
	Table = "flatnet-dns"
	// Label marks the IPv4 addresses this package put on lo.
	Label = "lo:flatnetdns"
)

// Addrs is the loopback device's address state, behind an interface so
// tests can use a fake (netlink.go is the kernel's).
type Addrs interface {
	// Labelled lists the IPv4 addresses on lo with Label.
	Labelled() ([]netip.Addr, error)
	// Has reports whether a is on any device already (then it is not
	// ours to add or remove, e.g. 127.0.0.1 for a test server).
	Has(a netip.Addr) (bool, error)
	Add(a netip.Addr) error
	Del(a netip.Addr) error
}

// Local takes and releases the DNS addresses.
type Local struct {
	nft   nft.Interface
	addrs Addrs
	added map[netip.Addr]bool // IPv6 addresses this process added
}

// New returns a Local over n (family inet, table Table) and a.
func New(n nft.Interface, a Addrs) *Local {
	return &Local{nft: n, addrs: a, added: map[netip.Addr]bool{}}
}

// ours are the addresses this package put on lo.
func (l *Local) ours() ([]netip.Addr, error) {
	out, err := l.addrs.Labelled()
	if err != nil {
		return nil, fmt.Errorf("listing the DNS addresses on lo: %w", err)
	}
	for a := range l.added {
		out = append(out, a)
	}
	return out, nil
}

// NewDefault returns a Local on the kernel: the nft binary and netlink.
func NewDefault() (*Local, error) {
	r, err := nft.New(knftables.InetFamily, Table, nft.StandardPaths...)
	if err != nil {
		return nil, fmt.Errorf("the cluster DNS addresses need nftables (notrack): %w", err)
	}
	return New(r, Netlink{}), nil
}

type rule struct{ text, comment string }

func rules(addrs []netip.Addr, port uint16) []rule {
	var out []rule
	p := strconv.Itoa(int(port))
	for _, fam := range []string{"ip", "ip6"} {
		var set []string
		for _, a := range addrs {
			if a.Is4() == (fam == "ip") {
				set = append(set, a.String())
			}
		}
		if len(set) == 0 {
			continue
		}
		slices.Sort(set)
		s := "{ " + strings.Join(set, ", ") + " }"
		if len(set) == 1 {
			s = set[0]
		}
		for _, proto := range []string{"udp", "tcp"} {
			out = append(out,
				rule{fmt.Sprintf("%s daddr %s %s dport %s notrack", fam, s, proto, p), fmt.Sprintf("queries to %s %s/%s", s, proto, p)},
				rule{fmt.Sprintf("%s saddr %s %s sport %s notrack", fam, s, proto, p), fmt.Sprintf("replies from %s %s/%s", s, proto, p)})
		}
	}
	return out
}

// chains in name order (how nft and the fake list them).
var chains = []string{"output", "prerouting"}

// Sync takes addrs (port: the server's port) and releases addresses it
// took before that are no longer wanted. A second Sync with the same input
// changes nothing.
func (l *Local) Sync(ctx context.Context, addrs []netip.Addr, port uint16) error {
	if err := l.syncTable(ctx, addrs, port); err != nil {
		return err
	}
	ours, err := l.ours()
	if err != nil {
		return err
	}
	for _, a := range ours {
		if !slices.Contains(addrs, a) {
			if err := l.addrs.Del(a); err != nil {
				return fmt.Errorf("removing DNS address %s from lo: %w", a, err)
			}
			delete(l.added, a)
		}
	}
	for _, a := range addrs {
		if slices.Contains(ours, a) {
			continue
		}
		has, err := l.addrs.Has(a)
		if err != nil {
			return fmt.Errorf("looking for %s on this node: %w", a, err)
		}
		if has {
			continue // already local (another device, or a test's 127.0.0.1)
		}
		if err := l.addrs.Add(a); err != nil {
			return fmt.Errorf("adding DNS address %s to lo: %w", a, err)
		}
		if a.Is6() {
			l.added[a] = true
		}
	}
	return nil
}

func (l *Local) syncTable(ctx context.Context, addrs []netip.Addr, port uint16) error {
	want := rules(addrs, port)
	cur, err := l.nft.ListTable(ctx)
	if err != nil {
		return fmt.Errorf("reading nftables table %s: %w", Table, err)
	}
	if upToDate(cur, want) {
		return nil
	}
	tx := l.nft.NewTransaction()
	if cur != nil {
		tx.Delete(&knftables.Table{})
	}
	if len(want) == 0 {
		if cur == nil {
			return nil
		}
	} else {
		tx.Add(&knftables.Table{Comment: knftables.PtrTo("flatnet agent: cluster DNS packets skip conntrack")})
		for _, c := range chains {
			hook := knftables.PreroutingHook
			if c == "output" {
				hook = knftables.OutputHook
			}
			tx.Add(&knftables.Chain{Name: c, Type: knftables.PtrTo(knftables.FilterType), Hook: &hook,
				Priority: knftables.PtrTo(knftables.RawPriority)})
			for _, r := range want {
				tx.Add(&knftables.Rule{Chain: c, Rule: r.text, Comment: knftables.PtrTo(nft.Comment(r.comment))})
			}
		}
	}
	if err := l.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("writing nftables table %s: %w", Table, err)
	}
	return nil
}

func upToDate(cur *nft.Table, want []rule) bool {
	if cur == nil {
		return len(want) == 0
	}
	if !slices.Equal(cur.Chains, chains) || len(cur.Rules) != len(chains)*len(want) {
		return false
	}
	for i, r := range cur.Rules {
		c, w := chains[i/len(want)], want[i%len(want)]
		if r.Chain != c || r.Comment == nil || *r.Comment != nft.Comment(w.comment) {
			return false
		}
	}
	return true
}

// Remove releases everything: the table and the addresses this package
// added. Missing pieces are success.
func (l *Local) Remove(ctx context.Context) error {
	var errs []error
	if err := l.syncTable(ctx, nil, 0); err != nil && !nft.IsNotFound(err) {
		errs = append(errs, err)
	}
	ours, err := l.ours()
	if err != nil {
		errs = append(errs, err)
	}
	for _, a := range ours {
		if err := l.addrs.Del(a); err != nil {
			errs = append(errs, fmt.Errorf("removing DNS address %s from lo: %w", a, err))
		}
		delete(l.added, a)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("releasing the cluster DNS addresses: %w", err)
	}
	return nil
}
