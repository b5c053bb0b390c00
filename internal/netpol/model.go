// Package netpol is flatnet's network policy model: what a pod may send
// and receive, as plain data that the compiler (compile/) produces from
// NetworkPolicies, ClusterNetworkPolicies, Pods and Namespaces, that the
// renderer (nftables/) turns into kernel sets, and that Evaluate answers
// flow by flow (for `flatnet policy explain` and as the tests' reference).
//
// Design. A packet from A to B passes two checks: A's egress and B's
// ingress. Each check walks three tiers, as ClusterNetworkPolicy
// orders them:
//
//  1. Admin: ordered rules, first match wins. Accept allows (the later tiers
//     are skipped), Deny drops, Pass skips to the NetworkPolicy tier.
//  2. NetworkPolicy: when any NetworkPolicy isolates the pod in this
//     direction, the flow must match one of the Allowed entries (their
//     union), else it is dropped; a pod no policy isolates goes on.
//  3. Baseline: ordered rules, first match wins (Accept or Pass allow, Deny drops); nothing
//     matching allows.
//
// Everything is resolved at compile time: selectors become the peer pods'
// addresses, ipBlock minus except becomes prefixes, named ports become
// numbers (per destination pod). So an Entry is a box in (peer address,
// protocol, port) space and a check is "is the flow inside one of these
// boxes": the renderer turns each list of boxes into one concatenated
// interval set keyed by (pod address, peer, protocol, port), and a packet
// costs one set lookup per tier however many policies there are.
package netpol

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Direction is the side of the pod a check guards.
type Direction int

const (
	Ingress Direction = iota // traffic to the pod; the peer is the source
	Egress                   // traffic from the pod; the peer is the destination
)

func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// Protocol is an IP protocol number as the kernel matches it
// (meta l4proto). ProtoAny matches every protocol and port.
type Protocol uint8

const (
	ProtoAny  Protocol = 0
	ProtoTCP  Protocol = 6
	ProtoUDP  Protocol = 17
	ProtoSCTP Protocol = 132
)

func (p Protocol) String() string {
	switch p {
	case ProtoAny:
		return "any"
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoSCTP:
		return "sctp"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// Action is what a tier rule does with a flow it matches.
type Action int

const (
	Accept Action = iota
	Deny
	Pass // Admin tier only: skip to the NetworkPolicy tier
)

func (a Action) String() string {
	switch a {
	case Deny:
		return "Deny"
	case Pass:
		return "Pass"
	}
	return "Accept"
}

// RuleRef names the policy rule an entry came from.
type RuleRef struct {
	// Kind is "NetworkPolicy" or "ClusterNetworkPolicy".
	Kind string
	// Policy is the policy's namespace (empty for cluster-scoped) and name.
	Policy types.NamespacedName
	// Direction and Index: the rule's place in the policy's ingress or
	// egress list (0-based). Index is -1 for a policy that isolates the
	// pod with no rule in this direction (default deny).
	Direction Direction
	Index     int
}

func (r RuleRef) String() string {
	name := r.Policy.Name
	if r.Policy.Namespace != "" {
		name = r.Policy.Namespace + "/" + name
	}
	if r.Index < 0 {
		return fmt.Sprintf("%s %s (%s: no rule)", r.Kind, name, r.Direction)
	}
	return fmt.Sprintf("%s %s %s rule %d", r.Kind, name, r.Direction, r.Index)
}

// Entry is one allowed (or, in a tier rule, matched) box: peer addresses
// in Peer, protocol Proto, destination ports From..To. With Proto ProtoAny,
// From and To are 0 and 65535 (the rule had no ports: every protocol).
type Entry struct {
	Peer     netip.Prefix
	Proto    Protocol
	From, To uint16
}

// Matches reports whether a flow with this peer address, protocol and
// destination port is inside the box.
func (e Entry) Matches(peer netip.Addr, proto Protocol, port uint16) bool {
	if !e.Peer.Contains(peer) {
		return false
	}
	if e.Proto == ProtoAny {
		return true
	}
	return e.Proto == proto && port >= e.From && port <= e.To
}

func (e Entry) String() string {
	if e.Proto == ProtoAny {
		return e.Peer.String() + " any"
	}
	if e.From == e.To {
		return fmt.Sprintf("%s %s/%d", e.Peer, e.Proto, e.From)
	}
	return fmt.Sprintf("%s %s/%d-%d", e.Peer, e.Proto, e.From, e.To)
}

// Allow is an Entry with the rule that allowed it (for explain and
// per-policy counters; the renderer merges duplicates).
type Allow struct {
	Entry
	Rule RuleRef
}

// TierRule is one ordered rule of the Admin or Baseline tier, already
// resolved for one pod: it matches a flow inside any of Entries.
type TierRule struct {
	Action  Action
	Entries []Entry
	Rule    RuleRef
	// Priority orders rules across policies (lower first), then the
	// policy's name, then the rule's index; the compiler sorts.
	Priority int32
}

// Rules is one direction of one pod.
type Rules struct {
	Admin []TierRule
	// Isolated: some NetworkPolicy selects the pod for this direction;
	// Isolators names them (for explain: "denied by default deny of ...").
	Isolated  bool
	Isolators []RuleRef
	Allowed   []Allow
	Baseline  []TierRule
}

// Empty reports whether the direction needs no check (every flow allowed).
func (r *Rules) Empty() bool {
	return len(r.Admin) == 0 && !r.Isolated && len(r.Baseline) == 0
}

// Pod is a subject pod's compiled policy.
type Pod struct {
	Pod types.NamespacedName
	// IPs are the pod's addresses (status.podIPs).
	IPs     []netip.Addr
	Ingress Rules
	Egress  Rules
}

// Direction returns the pod's rules for d.
func (p *Pod) Direction(d Direction) *Rules {
	if d == Egress {
		return &p.Egress
	}
	return &p.Ingress
}

// Decision is the outcome of one check, with the rule that decided it.
type Decision struct {
	Allowed bool
	// Tier is "admin", "networkpolicy", "baseline" or "" (no rule: allowed
	// because nothing isolates the pod).
	Tier string
	// Rules: the deciding rule; for a NetworkPolicy default deny, every
	// policy isolating the pod.
	Rules []RuleRef
}

func (d Decision) String() string {
	verdict := "denied"
	if d.Allowed {
		verdict = "allowed"
	}
	if d.Tier == "" {
		return verdict + ": no policy selects the pod in this direction"
	}
	refs := make([]string, len(d.Rules))
	for i, r := range d.Rules {
		refs[i] = r.String()
	}
	if !d.Allowed && d.Tier == "networkpolicy" {
		return verdict + ": isolated by " + strings.Join(refs, ", ") + " and no rule allows it"
	}
	return verdict + " by " + strings.Join(refs, ", ")
}

// Check decides one direction of a flow for the pod owning r: peer is the
// other end's address, proto and port the destination's.
func (r *Rules) Check(peer netip.Addr, proto Protocol, port uint16) Decision {
admin:
	for _, tr := range r.Admin {
		if !matchesAny(tr.Entries, peer, proto, port) {
			continue
		}
		switch tr.Action {
		case Accept:
			return Decision{Allowed: true, Tier: "admin", Rules: []RuleRef{tr.Rule}}
		case Deny:
			return Decision{Allowed: false, Tier: "admin", Rules: []RuleRef{tr.Rule}}
		}
		break admin // Pass: on to the NetworkPolicy tier
	}
	if r.Isolated {
		for _, a := range r.Allowed {
			if a.Matches(peer, proto, port) {
				return Decision{Allowed: true, Tier: "networkpolicy", Rules: []RuleRef{a.Rule}}
			}
		}
		return Decision{Allowed: false, Tier: "networkpolicy", Rules: r.Isolators}
	}
	for _, tr := range r.Baseline {
		if matchesAny(tr.Entries, peer, proto, port) {
			// Pass skips the rest of the tier; after Baseline comes "allow".
			return Decision{Allowed: tr.Action != Deny, Tier: "baseline", Rules: []RuleRef{tr.Rule}}
		}
	}
	return Decision{Allowed: true}
}

func matchesAny(es []Entry, peer netip.Addr, proto Protocol, port uint16) bool {
	for _, e := range es {
		if e.Matches(peer, proto, port) {
			return true
		}
	}
	return false
}

// Owned sorts pods by namespace/name and gives each address to one pod:
// the first by that order. It returns the sorted pods, each one's
// addresses (valid, unmapped), and an error for each address left out.
// Both renderers start from it, so a node's table never checks one
// address against two pods' rules.
func Owned(pods []Pod) ([]Pod, [][]netip.Addr, []error) {
	sorted := slices.Clone(pods)
	slices.SortFunc(sorted, func(a, b Pod) int { return cmp.Compare(a.Pod.String(), b.Pod.String()) })
	owner := map[netip.Addr]string{}
	addrs := make([][]netip.Addr, len(sorted))
	var conflicts []error
	for i, p := range sorted {
		for _, a := range p.IPs {
			a = a.Unmap()
			if !a.IsValid() {
				continue
			}
			if o, taken := owner[a]; taken {
				if o != p.Pod.String() {
					conflicts = append(conflicts, fmt.Errorf("pod %s: address %s is pod %s's too; left out", p.Pod, a, o))
				}
				continue
			}
			owner[a] = p.Pod.String()
			addrs[i] = append(addrs[i], a)
		}
	}
	return sorted, addrs, conflicts
}
