// Package nftables renders the compiled network policy of a node's own pods
// (netpol.Pod, from netpol/compile) into one nftables table, and keeps the
// kernel in step with small transactions (sync.go).
//
// Design. One inet table, one base chain on the forward hook at priority
// filter: after the proxy's DNAT (prerouting, dstnat), so policies see the
// pod addresses and pod ports that NetworkPolicy names, and, with
// br_netfilter on, bridged traffic between two pods of the same node.
// Traffic from the node itself (kubelet probes) never crosses forward, so it
// is always allowed, as NetworkPolicy requires.
//
//	forward (filter hook forward priority filter)
//	  ct state established,related accept           replies of allowed flows
//	  ct state new tcp flags & (fin|syn|rst|ack) != syn ip daddr @egress-pods-v4 drop
//	  ct state new tcp flags & (fin|syn|rst|ack) != syn ip saddr @ingress-pods-v4 drop
//	                                                 a cut flow picked up reversed
//	  ip saddr @egress-pods-v4 jump egress           local pods with egress rules
//	  ip daddr @ingress-pods-v4 jump ingress         ... with ingress rules
//	ingress                                          Admin tier, in order:
//	  ip daddr . ip saddr . meta l4proto . th dport @ingress-admin-<rule>-v4 return | counter drop | goto ingress-tiers
//	  goto ingress-tiers
//	ingress-tiers
//	  ip daddr @ingress-isolated-v4 goto ingress-np   NetworkPolicy tier
//	  ... @ingress-baseline-<rule>-v4 return | counter drop
//	ingress-np
//	  ip daddr . ip saddr . meta l4proto . th dport @ingress-allow-v4 return
//	  counter drop
//
// (egress the same with saddr and daddr swapped; every ip rule has an ip6
// twin on -v6 sets.) Every set is keyed by the local pod's address first,
// so one set serves all the node's pods, and a packet costs one lookup per
// tier (one per rule in the Admin and Baseline tiers, which are ordered)
// however many NetworkPolicies there are. An allow is `return`, never
// accept, so the other direction's check still runs; a deny is a drop, never
// a reject (a denied ClusterNetworkPolicy probe must time out).
//
// Elements are boxes in (pod, peer, protocol, port) space: `10.0.1.5 .
// 10.0.0.0/16 . 6 . 80-81`; no port (every protocol) is `0-255 . 0-65535`.
// The kernel refuses overlapping elements, so each set's boxes are made
// disjoint first (boxes.go).
package nftables

import (
	"cmp"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/nft"
)

// DefaultTable is the table's name (inet family); tests use their own.
const DefaultTable = "flatnet-policy"

// ChainForward is the base chain.
const ChainForward = "forward"

// Rule is one rule of a chain and its comment ("": none; made safe for
// nft by nft.Comment).
type Rule struct{ Rule, Comment string }

// Counter says what a named counter counts.
type Counter struct {
	Direction netpol.Direction
	// Tier is "admin", "networkpolicy" or "baseline".
	Tier string
	// Policies: the Deny rule's ClusterNetworkPolicy, or the
	// NetworkPolicies (namespace/name) that isolate Pod.
	Policies []string
	Pod      string
}

// comment is the counter's nft comment.
func (c Counter) comment() string {
	who := c.Pod
	if who == "" {
		who = strings.Join(c.Policies, ",")
	}
	return nft.Comment(fmt.Sprintf("%s %s drops: %s", c.Direction, c.Tier, who))
}

// Set is a set's type; Interval sets hold boxes.
type Set struct {
	Type     string
	Interval bool
}

// Ruleset is the table's desired content as plain data.
type Ruleset struct {
	// Chains maps every chain (ChainForward included) to its rules.
	Chains map[string][]Rule
	Sets   map[string]Set
	// Elements maps each set to its elements, fields joined by " . ", by
	// the local pod address they start with (every element does).
	Elements map[string]map[netip.Addr][]string
	// Counters are the named counters of dropped packets: one per Deny
	// rule of a tier, one per pod the NetworkPolicy tier isolates. Named
	// counters outlive the rewrite of the chains that use them.
	Counters map[string]Counter
	// Pods counts the pods whose rules are in the table.
	Pods int
	// Conflicts lists pod addresses left out because another pod (first by
	// namespace/name) has them.
	Conflicts []error
}

// NumElements counts the elements of every set.
func (r *Ruleset) NumElements() int {
	n := 0
	for _, byAddr := range r.Elements {
		for _, keys := range byAddr {
			n += len(keys)
		}
	}
	return n
}

type direction struct {
	d         netpol.Direction
	pod, peer string // the selectors of the pod's and the peer's address
}

// egress first, then ingress: a packet between two local pods passes both.
var directions = []direction{{netpol.Egress, "saddr", "daddr"}, {netpol.Ingress, "daddr", "saddr"}}

type family struct {
	suffix, kw, addrType string
}

var families = []family{{"v4", "ip", "ipv4_addr"}, {"v6", "ip6", "ipv6_addr"}}

func familyOf(a netip.Addr) family {
	if a.Is4() {
		return families[0]
	}
	return families[1]
}

func (f family) boxType() string {
	return f.addrType + " . " + f.addrType + " . inet_proto . inet_service"
}

// key is the lookup key of direction d's sets for family f.
func (f family) key(d direction) string {
	return fmt.Sprintf("%s %s . %s %s . meta l4proto . th dport", f.kw, d.pod, f.kw, d.peer)
}

func setName(d direction, what string, f family) string {
	return d.d.String() + "-" + what + "-" + f.suffix
}

// tierRule gathers one Admin or Baseline rule over the node's pods.
type tierRule struct {
	ref     netpol.RuleRef
	action  netpol.Action
	prio    int32
	entries map[netip.Addr][]netpol.Entry // pod address -> its entries
}

func compareRules(a, b *tierRule) int {
	return cmp.Or(cmp.Compare(a.prio, b.prio), cmp.Compare(a.ref.Policy.Namespace, b.ref.Policy.Namespace),
		cmp.Compare(a.ref.Policy.Name, b.ref.Policy.Name), cmp.Compare(a.ref.Index, b.ref.Index), cmp.Compare(a.ref.Kind, b.ref.Kind))
}

type refKey struct {
	kind, ns, name string
	index          int
}

func keyOf(r netpol.RuleRef) refKey {
	return refKey{r.Kind, r.Policy.Namespace, r.Policy.Name, r.Index}
}

// Render computes the table for pods, the node's own pods. A tier's rules
// are put in one order for all pods, by priority, policy and index (as the
// compiler sorts them); a pod whose rules disagree with it is an error.
func Render(pods []netpol.Pod) (*Ruleset, error) { return NewRenderer().Render(pods) }

// Renderer is Render with a memory: each pod address's elements of each
// set, with the entries they came from, so that a sync after a small
// change costs comparing entries, not making boxes disjoint again.
type Renderer struct {
	cache map[cacheKey]cached
}

type cacheKey struct {
	set  string
	addr netip.Addr
}

type cached struct {
	entries []netpol.Entry
	keys    []string
}

// NewRenderer returns a Renderer with an empty memory.
func NewRenderer() *Renderer { return &Renderer{cache: map[cacheKey]cached{}} }

// Render is Render. The Rulesets it returns share element slices, which
// nothing modifies.
func (rd *Renderer) Render(pods []netpol.Pod) (*Ruleset, error) {
	rs := &Ruleset{Chains: map[string][]Rule{}, Sets: map[string]Set{}, Elements: map[string]map[netip.Addr][]string{}, Counters: map[string]Counter{}}
	next := make(map[cacheKey]cached, len(rd.cache))
	// Each address belongs to one pod.
	sorted, addrs, conflicts := netpol.Owned(pods)
	rs.Conflicts = append(rs.Conflicts, conflicts...)
	put := func(set string, a netip.Addr, keys []string) {
		if len(keys) == 0 {
			return
		}
		if rs.Elements[set] == nil {
			rs.Elements[set] = map[netip.Addr][]string{}
		}
		rs.Elements[set][a] = keys
	}
	// boxes puts a's elements for entries into set: from memory when the
	// entries are the same as last time.
	boxes := func(set string, a netip.Addr, entries []netpol.Entry) {
		k := cacheKey{set, a}
		c, ok := rd.cache[k]
		if !ok || !slices.Equal(c.entries, entries) {
			c = cached{entries: entries}
			for _, b := range disjoint(boxesOf(entries, a)) {
				c.keys = append(c.keys, elementKey(append([]string{a.String()}, b.fields()...)))
			}
		}
		next[k] = c
		put(set, a, c.keys)
	}
	for _, d := range directions {
		tiers := [2]map[refKey]*tierRule{{}, {}} // admin, baseline
		var npDrops []Rule                       // a counted drop per isolated pod address
		for i, p := range sorted {
			r := p.Direction(d.d)
			if r.Empty() || len(addrs[i]) == 0 {
				continue
			}
			if r.Isolated {
				name := fmt.Sprintf("%s-np-%s", d.d, hashString(p.Pod.String()))
				c := Counter{Direction: d.d, Tier: "networkpolicy", Pod: p.Pod.String()}
				for _, ref := range r.Isolators {
					c.Policies = append(c.Policies, policyName(ref))
				}
				rs.Counters[name] = c
				for _, a := range addrs[i] {
					npDrops = append(npDrops, Rule{Rule: fmt.Sprintf("%s %s %s counter name %q drop", familyOf(a).kw, d.pod, a, name), Comment: nft.Comment(p.Pod.String())})
				}
			}
			for _, a := range addrs[i] {
				f := familyOf(a)
				put(setName(d, "pods", f), a, []string{a.String()})
				if r.Isolated {
					put(setName(d, "isolated", f), a, []string{a.String()})
					entries := make([]netpol.Entry, len(r.Allowed))
					for k, al := range r.Allowed {
						entries[k] = al.Entry
					}
					boxes(setName(d, "allow", f), a, entries)
				}
			}
			for t, list := range [2][]netpol.TierRule{r.Admin, r.Baseline} {
				for _, tr := range list {
					g := tiers[t][keyOf(tr.Rule)]
					if g == nil {
						g = &tierRule{ref: tr.Rule, action: tr.Action, prio: tr.Priority, entries: map[netip.Addr][]netpol.Entry{}}
						tiers[t][keyOf(tr.Rule)] = g
					}
					for _, a := range addrs[i] {
						g.entries[a] = append(g.entries[a], tr.Entries...)
					}
				}
			}
		}
		ordered := [2][]*tierRule{}
		for t := range tiers {
			for _, g := range tiers[t] {
				ordered[t] = append(ordered[t], g)
			}
			slices.SortFunc(ordered[t], compareRules)
			if err := checkOrder(sorted, d.d, t, ordered[t]); err != nil {
				return nil, err
			}
		}

		tiersChain := d.d.String() + "-tiers"
		npChain := d.d.String() + "-np"
		var admin, rest, np []Rule
		for t, list := range ordered {
			for _, g := range list {
				verdict := "return"
				tier := [2]string{"admin", "baseline"}[t]
				switch g.action {
				case netpol.Deny:
					name := fmt.Sprintf("%s-%s-%s", d.d, tier, hash(g.ref))
					rs.Counters[name] = Counter{Direction: d.d, Tier: tier, Policies: []string{policyName(g.ref)}}
					verdict = fmt.Sprintf("counter name %q drop", name)
				case netpol.Pass:
					if t == 0 {
						verdict = "goto " + tiersChain
					}
				}
				for _, f := range families {
					set := fmt.Sprintf("%s-%s-%s-%s", d.d, tier, hash(g.ref), f.suffix)
					for a, entries := range g.entries {
						if familyOf(a) == f {
							boxes(set, a, entries)
						}
					}
					if len(rs.Elements[set]) == 0 {
						continue
					}
					rs.Sets[set] = Set{Type: f.boxType(), Interval: true}
					rule := Rule{Rule: f.key(d) + " @" + set + " " + verdict, Comment: nft.Comment(g.action.String() + ": " + g.ref.String())}
					if t == 0 {
						admin = append(admin, rule)
					} else {
						rest = append(rest, rule)
					}
				}
			}
		}
		var isolated []Rule
		for _, f := range families {
			rs.Sets[setName(d, "pods", f)] = Set{Type: f.addrType}
			rs.Sets[setName(d, "isolated", f)] = Set{Type: f.addrType}
			rs.Sets[setName(d, "allow", f)] = Set{Type: f.boxType(), Interval: true}
			isolated = append(isolated, Rule{Rule: fmt.Sprintf("%s %s @%s goto %s", f.kw, d.pod, setName(d, "isolated", f), npChain)})
			np = append(np, Rule{Rule: f.key(d) + " @" + setName(d, "allow", f) + " return"})
		}
		rs.Chains[d.d.String()] = append(admin, Rule{Rule: "goto " + tiersChain})
		rs.Chains[tiersChain] = append(isolated, rest...)
		np = append(np, npDrops...)
		rs.Chains[npChain] = append(np, Rule{Rule: "counter drop", Comment: "NetworkPolicy: no rule allows it"})
	}
	fwd := []Rule{{Rule: "ct state established,related accept"}}
	// A TCP packet that opens no connection but has no conntrack entry
	// (conntrack.Cut deleted it) is picked up as a new flow in its own
	// direction. Coming from the pod whose ingress denied the flow (or
	// going to the pod whose egress did), that flow is allowed, and the
	// denied side's packets would pass as its replies: drop such pickups.
	for _, d := range directions {
		for _, f := range families {
			fwd = append(fwd, Rule{Rule: fmt.Sprintf("ct state new tcp flags & (fin|syn|rst|ack) != syn %s %s @%s drop", f.kw, d.peer, setName(d, "pods", f)),
				Comment: "a cut flow of a pod with " + d.d.String() + " rules, picked up the other way round"})
		}
	}
	for _, d := range directions {
		for _, f := range families {
			fwd = append(fwd, Rule{Rule: fmt.Sprintf("%s %s @%s jump %s", f.kw, d.pod, setName(d, "pods", f), d.d)})
		}
	}
	rs.Chains[ChainForward] = fwd
	for i, p := range sorted {
		if len(addrs[i]) > 0 && (!p.Ingress.Empty() || !p.Egress.Empty()) {
			rs.Pods++
		}
	}
	rd.cache = next
	return rs, nil
}

// boxesOf returns the entries of a's address family as boxes.
func boxesOf(entries []netpol.Entry, a netip.Addr) []box {
	var out []box
	for _, e := range entries {
		b, ok := entryBox(e)
		if ok && b.lo.Is4() == a.Is4() {
			out = append(out, b)
		}
	}
	return out
}

// checkOrder reports a pod whose tier t rules are not in the order of
// ordered (one order must hold for every pod, as the table has one chain).
func checkOrder(pods []netpol.Pod, d netpol.Direction, t int, ordered []*tierRule) error {
	pos := make(map[refKey]int, len(ordered))
	for i, g := range ordered {
		pos[keyOf(g.ref)] = i
	}
	for _, p := range pods {
		r := p.Direction(d)
		list := [2][]netpol.TierRule{r.Admin, r.Baseline}[t]
		for i := 1; i < len(list); i++ {
			if pos[keyOf(list[i-1].Rule)] >= pos[keyOf(list[i].Rule)] {
				return fmt.Errorf("pod %s: %s rules %q and %q are not in priority order (priority, policy name, rule index)",
					p.Pod, d, list[i-1].Rule, list[i].Rule)
			}
		}
	}
	return nil
}

// hash names a policy rule's sets: stable while the rule exists, so a
// reorder changes the chain, not the elements.
func hash(r netpol.RuleRef) string {
	return hashString(fmt.Sprintf("%s/%s/%s/%d", r.Kind, r.Policy.Namespace, r.Policy.Name, r.Index))
}

// hashString names a per-pod object by a short hash of its key.
func hashString(s string) string {
	sum := sha256.Sum256([]byte(s))
	return strings.ToLower(base32.StdEncoding.EncodeToString(sum[:])[:10])
}

// policyName is a rule's policy as the metrics label it: namespace/name
// for a NetworkPolicy, the name of a ClusterNetworkPolicy.
func policyName(r netpol.RuleRef) string {
	if r.Policy.Namespace != "" {
		return r.Policy.Namespace + "/" + r.Policy.Name
	}
	return r.Policy.Name
}
