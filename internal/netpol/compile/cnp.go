package compile

// ClusterNetworkPolicy (sigs.k8s.io/network-policy-api v1beta1) compiles
// into the Admin and Baseline tiers of netpol.Rules: per direction, the
// rules of every policy selecting the pod, ordered by priority (lower
// first), then policy name, then rule index, each with the boxes its
// peers and protocols cover. A CNP rule is a NetworkPolicy rule with an
// action, so both share rule and appendRule:
//   - namespaces and pods peers are selectors (hostNetwork pods excluded,
//     as for NetworkPolicy); networks are address blocks;
//   - no protocols: every protocol and port; tcp/udp/sctp with a
//     destinationPort number or range (none: every port of it);
//     destinationNamedPort: the destination pod's container port of that
//     name, with its protocol;
//   - a peer or protocol this compiler does not know (nodes and
//     domainNames, experimental, need objects Input does not carry) fails
//     closed as the API asks: an Accept rule's unknown part matches
//     nothing, a Deny or Pass rule becomes "Deny all".

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/flatnet/flatnet/internal/netpol"
)

const cnpKind = "ClusterNetworkPolicy"

type clusterPolicy struct {
	name     string
	admin    bool
	priority int32
	nsSel    labels.Selector
	podSel   labels.Selector
	rules    [2][]*tierRule
}

type tierRule struct {
	rule
	action netpol.Action
	// shared: the rule's entries when they do not depend on the subject
	// (all but ingress named ports), built once and shared read-only by
	// every subject pod: 20 CNPs over 500 pods cost 4x the NetworkPolicy
	// compile before.
	once   sync.Once
	shared []netpol.Entry
}

func (c *Compiler) newClusterPolicy(p *cnpv1.ClusterNetworkPolicy) *clusterPolicy {
	cp := &clusterPolicy{name: p.Name, priority: p.Spec.Priority, podSel: labels.Everything()}
	ref := types.NamespacedName{Name: p.Name}
	switch p.Spec.Tier {
	case cnpv1.AdminTier:
		cp.admin = true
	case cnpv1.BaselineTier:
	default:
		c.errorf("ClusterNetworkPolicy %s: unknown tier %q, policy ignored", p.Name, p.Spec.Tier)
		return nil
	}
	switch s := p.Spec.Subject; {
	case s.Namespaces != nil:
		cp.nsSel = c.selectorOf(cnpKind, s.Namespaces, ref, "subject.namespaces")
	case s.Pods != nil:
		cp.nsSel = c.selectorOf(cnpKind, &s.Pods.NamespaceSelector, ref, "subject.pods.namespaceSelector")
		cp.podSel = c.selectorOf(cnpKind, &s.Pods.PodSelector, ref, "subject.pods.podSelector")
	default:
		c.errorf("ClusterNetworkPolicy %s: subject has neither namespaces nor pods, policy ignored", p.Name)
		return nil
	}
	for i, r := range p.Spec.Ingress {
		peers := make([]cnpv1.ClusterNetworkPolicyEgressPeer, len(r.From))
		for j, f := range r.From {
			peers[j] = cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: f.Namespaces, Pods: f.Pods}
		}
		cp.rules[netpol.Ingress] = append(cp.rules[netpol.Ingress], c.newTierRule(p.Name, i, r.Action, r.Protocols, peers))
	}
	for i, r := range p.Spec.Egress {
		cp.rules[netpol.Egress] = append(cp.rules[netpol.Egress], c.newTierRule(p.Name, i, r.Action, r.Protocols, r.To))
	}
	return cp
}

func (c *Compiler) newTierRule(policy string, index int, action cnpv1.ClusterNetworkPolicyRuleAction, protocols []cnpv1.ClusterNetworkPolicyProtocol, peers []cnpv1.ClusterNetworkPolicyEgressPeer) *tierRule {
	ref := types.NamespacedName{Name: policy}
	r := &tierRule{rule: rule{index: index, anyPort: len(protocols) == 0}}
	failClosed := false
	unknown := func(what string) {
		c.errorf("ClusterNetworkPolicy %s: rule %d: %s not supported: the rule fails closed", policy, index, what)
		failClosed = true
	}
	switch action {
	case cnpv1.ClusterNetworkPolicyRuleActionAccept:
		r.action = netpol.Accept
	case cnpv1.ClusterNetworkPolicyRuleActionDeny:
		r.action = netpol.Deny
	case cnpv1.ClusterNetworkPolicyRuleActionPass:
		r.action = netpol.Pass
	default:
		r.action = netpol.Deny
		unknown("action " + string(action))
	}
	for _, p := range protocols {
		var proto netpol.Protocol
		var port *cnpv1.Port
		switch {
		case p.TCP != nil:
			proto, port = netpol.ProtoTCP, p.TCP.DestinationPort
		case p.UDP != nil:
			proto, port = netpol.ProtoUDP, p.UDP.DestinationPort
		case p.SCTP != nil:
			proto, port = netpol.ProtoSCTP, p.SCTP.DestinationPort
		case p.DestinationNamedPort != "":
			r.named = append(r.named, namedPort{proto: netpol.ProtoAny, name: p.DestinationNamedPort})
			continue
		default:
			unknown("a protocol with no known field")
			continue
		}
		from, to := int32(0), int32(65535)
		switch {
		case port == nil:
		case port.Range != nil:
			from, to = port.Range.Start, port.Range.End
		default:
			from, to = port.Number, port.Number
		}
		if from < 0 || to > 65535 || to < from {
			unknown("port range outside 0-65535")
			continue
		}
		r.fixed = append(r.fixed, portRange{proto: proto, from: uint16(from), to: uint16(to)})
	}
	for j, peer := range peers {
		switch {
		case peer.Namespaces != nil:
			r.selected = append(r.selected, &selector{nsSel: c.selectorOf(cnpKind, peer.Namespaces, ref, "peer namespaces"), podSel: labels.Everything()})
		case peer.Pods != nil:
			r.selected = append(r.selected, &selector{
				nsSel:  c.selectorOf(cnpKind, &peer.Pods.NamespaceSelector, ref, "peer pods.namespaceSelector"),
				podSel: c.selectorOf(cnpKind, &peer.Pods.PodSelector, ref, "peer pods.podSelector"),
			})
		case len(peer.Networks) > 0:
			var block []netip.Prefix
			for _, n := range peer.Networks {
				pfx, err := netip.ParsePrefix(string(n))
				if err != nil {
					c.errorf("ClusterNetworkPolicy %s: rule %d: networks: %w", policy, index, err)
					failClosed = true
					continue
				}
				block = append(block, pfx.Masked())
			}
			r.blocks = append(r.blocks, block)
		case peer.Nodes != nil:
			unknown("a nodes peer")
		case len(peer.DomainNames) > 0:
			unknown("a domainNames peer")
		default:
			unknown(fmt.Sprintf("peer %d with no known field", j))
		}
	}
	if failClosed && r.action != netpol.Accept {
		// "Deny all": every peer, protocol and port.
		r.action = netpol.Deny
		r.rule = rule{index: index, anyPort: true, allPeers: true}
	}
	return r
}

// sortClusterPolicies orders policies as the tiers evaluate them.
func sortClusterPolicies(ps []*clusterPolicy) {
	slices.SortFunc(ps, func(a, b *clusterPolicy) int {
		return cmp.Or(cmp.Compare(a.priority, b.priority), cmp.Compare(a.name, b.name))
	})
}

// clusterRules appends the Admin and Baseline rules of the policies
// selecting the subject pod (in order: policies are sorted, rules kept in
// their index order).
func (c *Compiler) clusterRules(out *netpol.Pod, b *builder, nsLabels, podLabels labels.Set, subjectPorts func() []containerPort) {
	for _, cp := range c.cluster {
		if !cp.nsSel.Matches(nsLabels) || !cp.podSel.Matches(podLabels) {
			continue
		}
		for d := netpol.Ingress; d <= netpol.Egress; d++ {
			rs := out.Direction(d)
			for _, r := range cp.rules[d] {
				var entries []netpol.Entry
				if d == netpol.Ingress && len(r.named) > 0 {
					b.reset()
					c.appendRule(b, &r.rule, d, subjectPorts())
					entries = b.sortedEntries()
				} else {
					r.once.Do(func() {
						sb := builders.Get().(*builder)
						defer builders.Put(sb)
						sb.reset()
						c.appendRule(sb, &r.rule, d, nil)
						r.shared = sb.sortedEntries()
					})
					entries = r.shared
				}
				if len(entries) == 0 {
					continue // matches nothing
				}
				ref := netpol.RuleRef{Kind: cnpKind, Policy: types.NamespacedName{Name: cp.name}, Direction: d, Index: r.index}
				tr := netpol.TierRule{Action: r.action, Rule: ref, Priority: cp.priority, Entries: entries}
				if cp.admin {
					rs.Admin = append(rs.Admin, tr)
				} else {
					rs.Baseline = append(rs.Baseline, tr)
				}
			}
		}
	}
}
