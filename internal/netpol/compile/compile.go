// Package compile turns NetworkPolicies, Pods and Namespaces into each
// subject pod's netpol.Pod: the boxes in (peer address, protocol, port)
// space its ingress and egress allow. It is pure (no kernel, no API
// calls) so the agent can recompile on every change and the renderer can
// diff the result.
//
// Design. New indexes the input once: policies by namespace with their
// selectors parsed, peer-eligible pods by namespace, namespace labels.
// Pod then walks only the policies of the subject's namespace. A peer
// selector's matching pods are resolved on first use and cached, so a
// selector shared by many subject pods is evaluated once per Compiler.
//
// Semantics follow NetworkPolicy v1 exactly, and where the API docs leave
// room, cyclonus's matcher (the differential test's oracle):
//   - a named port is resolved on the destination pod: the subject for
//     ingress, each peer for egress (the same name may give different
//     numbers per peer); an egress named port towards an ipBlock or "all"
//     matches the pods inside the range that carry the name, and never an
//     address outside the cluster (it has no port names);
//   - ipBlock except is no deny: the CIDR minus the excepts becomes
//     prefixes, and another rule or policy may allow the excepted range;
//   - hostNetwork pods are never subjects nor peers by selector; pods with
//     no IP or in phase Succeeded/Failed are never peers; a pod being
//     deleted still is while it has addresses.
//
// The Compiler is immutable after New and safe for concurrent Pod calls.
package compile

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flatnet/flatnet/internal/netpol"
)

// Input is everything the compiler reads. The objects are not copied nor
// modified; the caller must not modify them while the Compiler is in use.
type Input struct {
	NetworkPolicies []*networkingv1.NetworkPolicy
	Pods            []*corev1.Pod
	Namespaces      []*corev1.Namespace
}

// Compiler answers Pod for one snapshot of Input.
type Compiler struct {
	policies map[string][]*policy // by namespace, sorted by name
	nsLabels map[string]labels.Set
	byNS     map[string][]*peerPod // peer-eligible pods, sorted by name
	nsNames  []string              // keys of byNS, sorted
	peers    []*peerPod            // all peer-eligible pods, in nsNames order
	errs     []error
}

// peerPod is a pod that other pods' rules may name.
type peerPod struct {
	ns, name string
	labels   labels.Set
	prefixes []netip.Prefix // /32 and /128 of its addresses
	ports    []containerPort
}

type containerPort struct {
	name  string
	proto netpol.Protocol
	num   uint16
}

type policy struct {
	name    types.NamespacedName
	subject labels.Selector
	// isolates[d]: the policy's policyTypes (or their defaults) include d.
	isolates [2]bool
	rules    [2][]*rule
}

// rule is one ingress or egress rule with its peers and ports parsed.
type rule struct {
	index    int
	anyPort  bool        // no ports: every protocol and port
	fixed    []portRange // numeric ports and ranges
	named    []namedPort
	allPeers bool // no from/to: any address
	blocks   [][]netip.Prefix
	selected []*selector
}

type portRange struct {
	proto    netpol.Protocol
	from, to uint16
}

type namedPort struct {
	proto netpol.Protocol
	name  string
}

// selector is a pods/namespaces peer; pods are resolved once, on first use.
type selector struct {
	ns     string          // the policy's namespace when nsSel is nil
	nsSel  labels.Selector // nil: the policy's namespace only
	podSel labels.Selector
	once   sync.Once
	pods   []*peerPod
}

var anyAddress = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

// New indexes in for Pod calls.
func New(in Input) *Compiler {
	c := &Compiler{
		policies: map[string][]*policy{},
		nsLabels: make(map[string]labels.Set, len(in.Namespaces)),
		byNS:     map[string][]*peerPod{},
	}
	for _, ns := range in.Namespaces {
		c.nsLabels[ns.Name] = labels.Set(ns.Labels)
	}
	for _, pod := range in.Pods {
		if p := newPeerPod(pod); p != nil {
			c.byNS[p.ns] = append(c.byNS[p.ns], p)
		}
	}
	for ns, pods := range c.byNS {
		c.nsNames = append(c.nsNames, ns)
		slices.SortFunc(pods, func(a, b *peerPod) int { return cmp.Compare(a.name, b.name) })
	}
	sort.Strings(c.nsNames)
	for _, ns := range c.nsNames {
		c.peers = append(c.peers, c.byNS[ns]...)
	}
	for _, np := range in.NetworkPolicies {
		p := c.newPolicy(np)
		c.policies[np.Namespace] = append(c.policies[np.Namespace], p)
	}
	for _, ps := range c.policies {
		slices.SortFunc(ps, func(a, b *policy) int { return cmp.Compare(a.name.Name, b.name.Name) })
	}
	return c
}

// Errors lists what New could not parse (a selector, a CIDR, a port); the
// part in error matches nothing, so its policy still isolates.
func (c *Compiler) Errors() []error { return c.errs }

func (c *Compiler) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// newPeerPod returns nil for a pod that can never be a peer.
func newPeerPod(pod *corev1.Pod) *peerPod {
	if pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	ips := podIPs(pod)
	if len(ips) == 0 {
		return nil
	}
	p := &peerPod{ns: pod.Namespace, name: pod.Name, labels: labels.Set(pod.Labels), ports: namedPorts(pod)}
	p.prefixes = make([]netip.Prefix, len(ips))
	for i, ip := range ips {
		p.prefixes[i] = netip.PrefixFrom(ip, ip.BitLen())
	}
	return p
}

// podIPs parses status.podIPs (status.podIP when the list is empty).
func podIPs(pod *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if ip, err := netip.ParseAddr(s); err == nil && !slices.Contains(out, ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	for _, ip := range pod.Status.PodIPs {
		add(ip.IP)
	}
	if len(out) == 0 && pod.Status.PodIP != "" {
		add(pod.Status.PodIP)
	}
	return out
}

// namedPorts lists the pod's container ports that have a name, from its
// containers and its sidecars (init containers that keep running).
func namedPorts(pod *corev1.Pod) []containerPort {
	var out []containerPort
	add := func(cs []corev1.Container, sidecarsOnly bool) {
		for i := range cs {
			if sidecarsOnly && (cs[i].RestartPolicy == nil || *cs[i].RestartPolicy != corev1.ContainerRestartPolicyAlways) {
				continue
			}
			for _, cp := range cs[i].Ports {
				proto, ok := protocol(cp.Protocol)
				if cp.Name == "" || !ok || cp.ContainerPort <= 0 || cp.ContainerPort > 65535 {
					continue
				}
				out = append(out, containerPort{name: cp.Name, proto: proto, num: uint16(cp.ContainerPort)})
			}
		}
	}
	add(pod.Spec.Containers, false)
	add(pod.Spec.InitContainers, true)
	return out
}

// protocol maps an API protocol (empty means TCP) to its number.
func protocol(p corev1.Protocol) (netpol.Protocol, bool) {
	switch p {
	case "", corev1.ProtocolTCP:
		return netpol.ProtoTCP, true
	case corev1.ProtocolUDP:
		return netpol.ProtoUDP, true
	case corev1.ProtocolSCTP:
		return netpol.ProtoSCTP, true
	}
	return 0, false
}

func (c *Compiler) newPolicy(np *networkingv1.NetworkPolicy) *policy {
	p := &policy{name: types.NamespacedName{Namespace: np.Namespace, Name: np.Name}}
	p.subject = c.selector(&np.Spec.PodSelector, p.name, "podSelector")
	if len(np.Spec.PolicyTypes) == 0 {
		// The apiserver's defaults: Ingress always, Egress with egress rules.
		p.isolates[netpol.Ingress] = true
		p.isolates[netpol.Egress] = len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			p.isolates[netpol.Ingress] = true
		case networkingv1.PolicyTypeEgress:
			p.isolates[netpol.Egress] = true
		default:
			c.errorf("NetworkPolicy %s: unknown policyType %q, ignored", p.name, t)
		}
	}
	// Rules of a direction missing from policyTypes are ignored: the
	// policy neither isolates nor allows anything in that direction.
	if p.isolates[netpol.Ingress] {
		for i, r := range np.Spec.Ingress {
			p.rules[netpol.Ingress] = append(p.rules[netpol.Ingress], c.newRule(p.name, i, r.Ports, r.From))
		}
	}
	if p.isolates[netpol.Egress] {
		for i, r := range np.Spec.Egress {
			p.rules[netpol.Egress] = append(p.rules[netpol.Egress], c.newRule(p.name, i, r.Ports, r.To))
		}
	}
	return p
}

// selector parses s; a selector that does not parse matches nothing.
func (c *Compiler) selector(s *metav1.LabelSelector, pol types.NamespacedName, what string) labels.Selector {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		c.errorf("NetworkPolicy %s: %s: %w", pol, what, err)
		return labels.Nothing()
	}
	return sel
}

func (c *Compiler) newRule(pol types.NamespacedName, index int, ports []networkingv1.NetworkPolicyPort, peers []networkingv1.NetworkPolicyPeer) *rule {
	r := &rule{index: index, anyPort: len(ports) == 0, allPeers: len(peers) == 0}
	for _, p := range ports {
		proto := netpol.ProtoTCP
		if p.Protocol != nil {
			var ok bool
			if proto, ok = protocol(*p.Protocol); !ok {
				c.errorf("NetworkPolicy %s: rule %d: unknown protocol %q, port ignored", pol, index, *p.Protocol)
				continue
			}
		}
		switch {
		case p.Port == nil:
			r.fixed = append(r.fixed, portRange{proto: proto, from: 0, to: 65535})
		case p.Port.Type == intstr.String:
			if p.EndPort != nil {
				c.errorf("NetworkPolicy %s: rule %d: endPort with named port %q, port ignored", pol, index, p.Port.StrVal)
				continue
			}
			r.named = append(r.named, namedPort{proto: proto, name: p.Port.StrVal})
		default:
			from, to := p.Port.IntVal, p.Port.IntVal
			if p.EndPort != nil {
				to = *p.EndPort
			}
			if from < 0 || to > 65535 || to < from {
				c.errorf("NetworkPolicy %s: rule %d: invalid port range %d-%d, port ignored", pol, index, from, to)
				continue
			}
			r.fixed = append(r.fixed, portRange{proto: proto, from: uint16(from), to: uint16(to)})
		}
	}
	for _, peer := range peers {
		if peer.IPBlock != nil {
			r.blocks = append(r.blocks, c.ipBlock(pol, index, peer.IPBlock))
			continue
		}
		s := &selector{ns: pol.Namespace, podSel: labels.Everything()}
		if peer.PodSelector != nil {
			s.podSel = c.selector(peer.PodSelector, pol, fmt.Sprintf("rule %d: podSelector", index))
		}
		if peer.NamespaceSelector != nil {
			s.nsSel = c.selector(peer.NamespaceSelector, pol, fmt.Sprintf("rule %d: namespaceSelector", index))
		}
		r.selected = append(r.selected, s)
	}
	return r
}

// ipBlock returns the block's CIDR minus its excepts, as prefixes.
func (c *Compiler) ipBlock(pol types.NamespacedName, index int, b *networkingv1.IPBlock) []netip.Prefix {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		c.errorf("NetworkPolicy %s: rule %d: ipBlock cidr: %w", pol, index, err)
		return nil
	}
	out := []netip.Prefix{cidr.Masked()}
	for _, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil {
			c.errorf("NetworkPolicy %s: rule %d: ipBlock except: %w", pol, index, err)
			continue
		}
		out = subtract(out, ex.Masked())
	}
	return out
}

// subtract removes ex from every prefix of ps, splitting a prefix that
// contains ex into the halves around it.
func subtract(ps []netip.Prefix, ex netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		out = appendMinus(out, p, ex)
	}
	return out
}

func appendMinus(out []netip.Prefix, p, ex netip.Prefix) []netip.Prefix {
	switch {
	case !p.Overlaps(ex):
		return append(out, p)
	case ex.Bits() <= p.Bits(): // ex covers p
		return out
	}
	// p strictly contains ex: keep the half without ex whole, recurse
	// into the other.
	lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
	hi := netip.PrefixFrom(nthBit(p.Addr(), p.Bits()), p.Bits()+1)
	if lo.Contains(ex.Addr()) {
		return appendMinus(append(out, hi), lo, ex)
	}
	return appendMinus(append(out, lo), hi, ex)
}

// nthBit returns a with bit n (0 = most significant) set.
func nthBit(a netip.Addr, n int) netip.Addr {
	b := a.AsSlice()
	b[n/8] |= 0x80 >> (n % 8)
	out, _ := netip.AddrFromSlice(b)
	return out
}

// resolve returns the pods s selects (cached on the selector).
func (c *Compiler) resolve(s *selector) []*peerPod {
	s.once.Do(func() {
		if s.nsSel == nil {
			for _, p := range c.byNS[s.ns] {
				if s.podSel.Matches(p.labels) {
					s.pods = append(s.pods, p)
				}
			}
			return
		}
		for _, ns := range c.nsNames {
			if !s.nsSel.Matches(c.nsLabels[ns]) {
				continue
			}
			for _, p := range c.byNS[ns] {
				if s.podSel.Matches(p.labels) {
					s.pods = append(s.pods, p)
				}
			}
		}
	})
	return s.pods
}

// Pod compiles the rules of pod as a subject. A hostNetwork pod is never
// a subject: it gets no addresses and no rules.
func (c *Compiler) Pod(pod *corev1.Pod) netpol.Pod {
	out := netpol.Pod{Pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}}
	if pod.Spec.HostNetwork {
		return out
	}
	out.IPs = podIPs(pod)
	podLabels := labels.Set(pod.Labels)
	var ports []containerPort // the subject's, resolved for ingress on first need
	portsDone := false
	for _, p := range c.policies[pod.Namespace] {
		if !p.subject.Matches(podLabels) {
			continue
		}
		for d := netpol.Ingress; d <= netpol.Egress; d++ {
			if !p.isolates[d] {
				continue
			}
			rs := out.Direction(d)
			rs.Isolated = true
			rs.Isolators = append(rs.Isolators, netpol.RuleRef{Kind: "NetworkPolicy", Policy: p.name, Direction: d, Index: -1})
			for _, r := range p.rules[d] {
				if d == netpol.Ingress && len(r.named) > 0 && !portsDone {
					ports, portsDone = namedPorts(pod), true
				}
				ref := netpol.RuleRef{Kind: "NetworkPolicy", Policy: p.name, Direction: d, Index: r.index}
				rs.Allowed = c.appendRule(rs.Allowed, r, d, ref, ports)
			}
		}
	}
	finish(&out.Ingress)
	finish(&out.Egress)
	return out
}

// appendRule appends the boxes rule r allows. subjectPorts are the
// subject's named ports (ingress: the destination is the subject).
func (c *Compiler) appendRule(out []netpol.Allow, r *rule, d netpol.Direction, ref netpol.RuleRef, subjectPorts []containerPort) []netpol.Allow {
	// Addresses of the peers, with the ports that do not depend on them.
	forPrefixes := func(ps []netip.Prefix) {
		for _, pfx := range ps {
			if r.anyPort {
				out = append(out, allow(pfx, netpol.ProtoAny, 0, 65535, ref))
				continue
			}
			for _, pr := range r.fixed {
				out = append(out, allow(pfx, pr.proto, pr.from, pr.to, ref))
			}
			if d == netpol.Ingress {
				for _, np := range r.named {
					for _, cp := range subjectPorts {
						if cp.name == np.name && cp.proto == np.proto {
							out = append(out, allow(pfx, cp.proto, cp.num, cp.num, ref))
						}
					}
				}
			}
		}
	}
	if r.allPeers {
		forPrefixes(anyAddress)
	}
	for _, b := range r.blocks {
		forPrefixes(b)
	}
	for _, s := range r.selected {
		for _, p := range c.resolve(s) {
			forPrefixes(p.prefixes)
		}
	}
	if d == netpol.Ingress || len(r.named) == 0 {
		return out
	}
	// Egress named ports: resolved on each destination pod.
	named := func(p *peerPod, inside func(netip.Prefix) bool) {
		for _, np := range r.named {
			for _, cp := range p.ports {
				if cp.name != np.name || cp.proto != np.proto {
					continue
				}
				for _, pfx := range p.prefixes {
					if inside(pfx) {
						out = append(out, allow(pfx, cp.proto, cp.num, cp.num, ref))
					}
				}
			}
		}
	}
	everywhere := func(netip.Prefix) bool { return true }
	if r.allPeers {
		for _, p := range c.peers {
			named(p, everywhere)
		}
	}
	for _, b := range r.blocks {
		in := func(pfx netip.Prefix) bool {
			for _, bp := range b {
				if bp.Contains(pfx.Addr()) {
					return true
				}
			}
			return false
		}
		for _, p := range c.peers {
			named(p, in)
		}
	}
	for _, s := range r.selected {
		for _, p := range c.resolve(s) {
			named(p, everywhere)
		}
	}
	return out
}

func allow(peer netip.Prefix, proto netpol.Protocol, from, to uint16, ref netpol.RuleRef) netpol.Allow {
	return netpol.Allow{Entry: netpol.Entry{Peer: peer, Proto: proto, From: from, To: to}, Rule: ref}
}

// finish sorts and de-duplicates, so that Pod's output is deterministic.
func finish(r *netpol.Rules) {
	slices.SortFunc(r.Isolators, compareRef)
	r.Isolators = slices.Compact(r.Isolators)
	slices.SortFunc(r.Allowed, compareAllow)
	r.Allowed = slices.Compact(r.Allowed)
}

func compareAllow(a, b netpol.Allow) int {
	if c := compareEntry(a.Entry, b.Entry); c != 0 {
		return c
	}
	return compareRef(a.Rule, b.Rule)
}

func compareEntry(a, b netpol.Entry) int {
	if c := a.Peer.Addr().Compare(b.Peer.Addr()); c != 0 {
		return c
	}
	return cmp.Or(
		cmp.Compare(a.Peer.Bits(), b.Peer.Bits()),
		cmp.Compare(a.Proto, b.Proto),
		cmp.Compare(a.From, b.From),
		cmp.Compare(a.To, b.To),
	)
}

func compareRef(a, b netpol.RuleRef) int {
	return cmp.Or(
		cmp.Compare(a.Kind, b.Kind),
		cmp.Compare(a.Policy.Namespace, b.Policy.Namespace),
		cmp.Compare(a.Policy.Name, b.Policy.Name),
		cmp.Compare(a.Direction, b.Direction),
		cmp.Compare(a.Index, b.Index),
	)
}
