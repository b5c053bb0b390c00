// Package iptables renders the compiled network policy of a node's own
// pods (netpol.Pod, from netpol/compile) as iptables rules, for nodes
// where nftables is missing, and keeps the kernel in step with one
// iptables-restore --noflush per IP family (sync.go).
//
// Design. The filter table, our own chains only (every name starts with
// FLATNET-NP), reached from FORWARD by one jump that the Syncer owns and
// keeps first: the nftables renderer's table sees every forwarded packet
// whatever other tables accept, so this jump must come before any other
// writer's ACCEPT. FORWARD runs after the proxy's DNAT, so rules see pod
// addresses and pod ports; node -> pod traffic never crosses it.
//
//	FORWARD              -j FLATNET-NP                     (first rule)
//	FLATNET-NP           -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN
//	                     -s <pod> -j FLATNET-NP-E-<pod>    every local pod with egress rules
//	                     -d <pod> -j FLATNET-NP-I-<pod>    ... with ingress rules
//	                     -d|-s <pod> -p tcp NEW, not a lone SYN -j DROP   a cut flow picked up reversed
//	FLATNET-NP-I-<pod>   Admin tier, in order, one rule per entry:
//	                     -s <peer> -p tcp -m tcp --dport 80:81 -j RETURN | DROP | -g FLATNET-NP-IT-<pod>
//	                     then the tiers (or -g FLATNET-NP-IT-<pod> when a Pass rule needs them apart):
//	                     isolated: -s <peer> [-p .. --dport ..] -j RETURN per allowed box, then -j DROP
//	                     otherwise: Baseline rules (Accept, Pass: RETURN; Deny: DROP)
//
// (egress the same with -d for the peer.) Allow is RETURN, never ACCEPT:
// the other direction's check still runs, and nothing after our jump in
// FORWARD is skipped (replies too return rather than accept: whoever
// decided FORWARD's verdict before us still decides it). Deny is DROP,
// never REJECT (a denied ClusterNetworkPolicy probe must time out).
//
// Cost. There is no ipset here, so this is the linear rendering the
// nftables one avoids: a new flow walks the node's pod jumps and then one
// rule per (rule, peer box) of the pods it touches. That is the price of
// the fallback; the nftables renderer is the one to run. The per-pod drop
// counters of the nftables table (flatnet_networkpolicy_* metrics) are not
// rendered.
package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netpol"
)

const (
	// ChainTop is the chain FORWARD jumps to; every chain of ours is it or
	// starts with it and a dash.
	ChainTop = "FLATNET-NP"
	// Table is the iptables table the chains live in.
	Table = "filter"
	// Forward is the built-in chain holding the jump.
	Forward = "FORWARD"
)

// Families are the IP families a Ruleset has rules for.
var Families = []ipt.Protocol{ipt.IPv4, ipt.IPv6}

// Ours reports whether chain is one of ours.
func Ours(chain string) bool { return chain == ChainTop || strings.HasPrefix(chain, ChainTop+"-") }

// Rule is one rule's arguments after "-A chain", in iptables-save's
// canonical form (so a save reads back what was written).
type Rule []string

// Chains maps each chain of one family (ChainTop included) to its rules.
type Chains map[string][]Rule

// Ruleset is the desired content of our chains, as plain data.
type Ruleset struct {
	Families map[ipt.Protocol]Chains
	// Pods counts the pods whose rules are in the chains.
	Pods int
	// Conflicts lists what was left out: pod addresses that another pod
	// (first by namespace/name) has, entries iptables cannot express.
	Conflicts []error
}

// NumRules counts the rules of every chain.
func (r *Ruleset) NumRules() int {
	n := 0
	for _, chains := range r.Families {
		for _, rules := range chains {
			n += len(rules)
		}
	}
	return n
}

// JumpRule is the rule in FORWARD.
var JumpRule = Rule{"-m", "comment", "--comment", "flatnet network policy", "-j", ChainTop}

var establishedRule = Rule{"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"}

// direction: which address is the pod's and which the peer's.
type direction struct {
	d         netpol.Direction
	pod, peer string // -s or -d
	tag       string // in chain names
}

// egress first, then ingress: a packet between two local pods passes both.
var directions = []direction{{netpol.Egress, "-s", "-d", "E"}, {netpol.Ingress, "-d", "-s", "I"}}

// Render computes the chains for pods, the node's own pods.
func Render(pods []netpol.Pod) *Ruleset {
	rs := &Ruleset{Families: map[ipt.Protocol]Chains{}}
	for _, f := range Families {
		rs.Families[f] = Chains{ChainTop: {establishedRule}}
	}
	// Each address belongs to one pod.
	sorted, addrs, conflicts := netpol.Owned(pods)
	rs.Conflicts = append(rs.Conflicts, conflicts...)
	for _, d := range directions {
		for i, p := range sorted {
			r := p.Direction(d.d)
			if r.Empty() || len(addrs[i]) == 0 {
				continue
			}
			reported := map[string]bool{}
			for _, f := range Families {
				var mine []netip.Addr
				for _, a := range addrs[i] {
					if a.Is6() == (f == ipt.IPv6) {
						mine = append(mine, a)
					}
				}
				if len(mine) == 0 {
					continue
				}
				chains := rs.Families[f]
				name := podChain(d, p.Pod.String(), "")
				for _, err := range renderPod(chains, p.Pod.String(), d, r, f) {
					if !reported[err.Error()] { // once, not once per family
						reported[err.Error()] = true
						rs.Conflicts = append(rs.Conflicts, fmt.Errorf("pod %s %s: %w", p.Pod, d.d, err))
					}
				}
				if len(chains[name]) == 0 { // nothing in this family: every packet returns
					delete(chains, name)
					continue
				}
				for _, a := range mine {
					chains[ChainTop] = append(chains[ChainTop], Rule{d.pod, host(a), "-m", "comment", "--comment", comment(p.Pod.String() + " " + d.d.String()), "-j", name},
						// A TCP packet that opens no connection and has no
						// conntrack entry (netpol/conntrack cut it), from the
						// pod whose ingress denied the flow (to the pod whose
						// egress did), would open it again the other way round,
						// and the denied side's packets would pass as replies.
						Rule{d.peer, host(a), "-p", "tcp", "-m", "tcp", "!", "--tcp-flags", "FIN,SYN,RST,ACK", "SYN", "-m", "conntrack", "--ctstate", "NEW",
							"-m", "comment", "--comment", comment(p.Pod.String() + " " + d.d.String() + ": a cut flow picked up the other way round"), "-j", "DROP"})
				}
			}
		}
	}
	for i, p := range sorted {
		if len(addrs[i]) > 0 && (!p.Ingress.Empty() || !p.Egress.Empty()) {
			rs.Pods++
		}
	}
	return rs
}

// renderPod writes the chain(s) of one direction of one pod into chains:
// its chain, and its tiers chain when an Admin Pass rule needs that apart.
// It returns the entries it could not express.
func renderPod(chains Chains, pod string, d direction, r *netpol.Rules, f ipt.Protocol) []error {
	var errs []error
	name, tiersName := podChain(d, pod, ""), podChain(d, pod, "T")
	var admin, tiers chainBuilder
	pass := false
	for _, tr := range r.Admin {
		target := []string{"-j", "RETURN"}
		switch tr.Action {
		case netpol.Deny:
			target = []string{"-j", "DROP"}
		case netpol.Pass:
			target, pass = []string{"-g", tiersName}, true
		}
		for _, e := range tr.Entries {
			errs = admin.add(e, d, f, tr.Action.String()+": "+tr.Rule.String(), target, errs)
		}
	}
	if r.Isolated {
		for _, a := range r.Allowed {
			errs = tiers.add(a.Entry, d, f, "", []string{"-j", "RETURN"}, errs)
		}
		isolators := make([]string, len(r.Isolators))
		for i, ref := range r.Isolators {
			isolators[i] = policyName(ref)
		}
		tiers.rules = append(tiers.rules, Rule{"-m", "comment", "--comment", comment("NetworkPolicy: isolated by " + strings.Join(isolators, ", ") + "; no rule allows it"), "-j", "DROP"})
	} else {
		for _, tr := range r.Baseline {
			target := []string{"-j", "RETURN"}
			if tr.Action == netpol.Deny {
				target = []string{"-j", "DROP"}
			}
			for _, e := range tr.Entries {
				errs = tiers.add(e, d, f, tr.Action.String()+": "+tr.Rule.String(), target, errs)
			}
		}
	}
	switch {
	case !pass:
		chains[name] = append(admin.rules, tiers.rules...)
	case len(tiers.rules) == 0: // nothing after the Admin tier: Pass allows
		chains[name] = admin.rules
		for i, rule := range chains[name] {
			if rule[len(rule)-1] == tiersName {
				chains[name][i] = append(rule[:len(rule)-2:len(rule)-2], "-j", "RETURN")
			}
		}
	default:
		chains[name] = append(admin.rules, Rule{"-g", tiersName})
		chains[tiersName] = tiers.rules
	}
	return errs
}

// chainBuilder collects one chain's rules, leaving out a rule whose match
// an earlier one already has (every target of ours ends the chain, so the
// earlier rule takes all its packets).
type chainBuilder struct {
	rules []Rule
	seen  map[string]bool
}

func (c *chainBuilder) add(e netpol.Entry, d direction, f ipt.Protocol, note string, target []string, errs []error) []error {
	m, err := match(e, d, f)
	if err != nil {
		return append(errs, err)
	}
	if m == nil {
		return errs // the other family's
	}
	key := strings.Join(m, " ")
	if c.seen[key] {
		return errs
	}
	if c.seen == nil {
		c.seen = map[string]bool{}
	}
	c.seen[key] = true
	if note != "" {
		m = append(m, "-m", "comment", "--comment", comment(note))
	}
	c.rules = append(c.rules, append(m, target...))
	return errs
}

// portMatches are the protocols with a --dport match.
var portMatches = map[netpol.Protocol]string{netpol.ProtoTCP: "tcp", netpol.ProtoUDP: "udp", netpol.ProtoSCTP: "sctp"}

// match renders an entry's box as iptables matches: nil (and no error)
// for an entry of the other family; never nil for one of this family (an
// entry matching everything is an empty, non-nil slice).
func match(e netpol.Entry, d direction, f ipt.Protocol) ([]string, error) {
	if !e.Peer.IsValid() || e.Peer.Addr().Is6() != (f == ipt.IPv6) {
		return nil, nil
	}
	m := []string{}
	if e.Peer.Bits() > 0 {
		m = append(m, d.peer, e.Peer.Masked().String())
	}
	if e.Proto == netpol.ProtoAny {
		return m, nil
	}
	name, ok := portMatches[e.Proto]
	if !ok {
		name = strconv.Itoa(int(e.Proto))
	}
	m = append(m, "-p", name)
	switch {
	case e.From > e.To:
		return nil, fmt.Errorf("entry %s: port range %d-%d is empty; left out", e, e.From, e.To)
	case e.From == 0 && e.To == 65535:
		return m, nil
	case !ok:
		return nil, fmt.Errorf("entry %s: iptables matches ports of tcp, udp and sctp only; left out", e)
	case e.From == e.To:
		return append(m, "-m", name, "--dport", strconv.Itoa(int(e.From))), nil
	}
	return append(m, "-m", name, "--dport", fmt.Sprintf("%d:%d", e.From, e.To)), nil
}

func host(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// podChain names a pod's chain for direction d: FLATNET-NP-E-<hash>, or
// FLATNET-NP-ET-<hash> for its tiers with suffix "T". The hash is of the
// pod's name, so a new address keeps the chain; 28 bytes at most.
func podChain(d direction, pod, suffix string) string {
	sum := sha256.Sum256([]byte(pod))
	return ChainTop + "-" + d.tag + suffix + "-" + base32.StdEncoding.EncodeToString(sum[:])[:10]
}

// comment makes s a printable iptables comment within its 255 bytes.
func comment(s string) string {
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

// policyName is a rule's policy: namespace/name for a NetworkPolicy.
func policyName(r netpol.RuleRef) string {
	if r.Policy.Namespace != "" {
		return r.Policy.Namespace + "/" + r.Policy.Name
	}
	return r.Policy.Name
}
