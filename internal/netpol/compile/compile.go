// Package compile turns NetworkPolicies, ClusterNetworkPolicies (cnp.go),
// Pods and Namespaces into each subject pod's netpol.Pod: the boxes in
// (peer address, protocol, port) space its ingress and egress allow, and
// the ordered Admin and Baseline tier rules. It is pure (no kernel, no API
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
	"encoding/binary"
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

	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/flatnet/flatnet/internal/netpol"
)

// Input is everything the compiler reads. The objects are not copied nor
// modified; the caller must not modify them while the Compiler is in use.
type Input struct {
	NetworkPolicies []*networkingv1.NetworkPolicy
	Pods            []*corev1.Pod
	Namespaces      []*corev1.Namespace
	// ClusterNetworkPolicies fill the Admin and Baseline tiers (cnp.go).
	ClusterNetworkPolicies []*cnpv1.ClusterNetworkPolicy
}

// Compiler answers Pod for one snapshot of Input.
type Compiler struct {
	policies map[string][]*policy // by namespace, sorted by name
	nsLabels map[string]labels.Set
	byNS     map[string][]*peerPod // peer-eligible pods, sorted by name
	nsNames  []string              // keys of byNS, sorted
	peers    []*peerPod            // all peer-eligible pods, in nsNames order
	cluster  []*clusterPolicy      // in tier order: priority, then name
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
	ord      int // place in the order of all policies by namespace, name
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
	proto netpol.Protocol // ProtoAny: the container port's (CNP names no protocol)
	name  string
}

func (np namedPort) matches(cp containerPort) bool {
	return cp.name == np.name && (np.proto == netpol.ProtoAny || cp.proto == np.proto)
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
	var ordered []*policy
	for _, ps := range c.policies {
		slices.SortFunc(ps, func(a, b *policy) int { return cmp.Compare(a.name.Name, b.name.Name) })
		ordered = append(ordered, ps...)
	}
	slices.SortFunc(ordered, func(a, b *policy) int {
		return cmp.Or(cmp.Compare(a.name.Namespace, b.name.Namespace), cmp.Compare(a.name.Name, b.name.Name))
	})
	for i, p := range ordered {
		p.ord = i
	}
	for _, p := range in.ClusterNetworkPolicies {
		if cp := c.newClusterPolicy(p); cp != nil {
			c.cluster = append(c.cluster, cp)
		}
	}
	sortClusterPolicies(c.cluster)
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

// selector parses a NetworkPolicy's selector s.
func (c *Compiler) selector(s *metav1.LabelSelector, pol types.NamespacedName, what string) labels.Selector {
	return c.selectorOf("NetworkPolicy", s, pol, what)
}

// selectorOf parses s; a selector that does not parse matches nothing.
func (c *Compiler) selectorOf(kind string, s *metav1.LabelSelector, pol types.NamespacedName, what string) labels.Selector {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		c.errorf("%s %s: %s: %w", kind, pol, what, err)
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
// a subject: it gets no addresses and no rules. The Entries of Admin and
// Baseline rules may be shared between the pods of one Compiler: read
// them, do not modify them.
func (c *Compiler) Pod(pod *corev1.Pod) netpol.Pod {
	out := netpol.Pod{Pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}}
	if pod.Spec.HostNetwork {
		return out
	}
	out.IPs = podIPs(pod)
	podLabels := labels.Set(pod.Labels)
	var ports []containerPort // the subject's, resolved for ingress on first need
	portsDone := false
	subjectPorts := func() []containerPort {
		if !portsDone {
			ports, portsDone = namedPorts(pod), true
		}
		return ports
	}
	b := builders.Get().(*builder)
	defer builders.Put(b)
	for d := netpol.Ingress; d <= netpol.Egress; d++ {
		rs := out.Direction(d)
		b.reset()
		for _, p := range c.policies[pod.Namespace] {
			if !p.isolates[d] || !p.subject.Matches(podLabels) {
				continue
			}
			rs.Isolated = true
			rs.Isolators = append(rs.Isolators, netpol.RuleRef{Kind: "NetworkPolicy", Policy: p.name, Direction: d, Index: -1})
			for _, r := range p.rules[d] {
				var ports []containerPort
				if d == netpol.Ingress && len(r.named) > 0 {
					ports = subjectPorts()
				}
				b.ref = netpol.RuleRef{Kind: "NetworkPolicy", Policy: p.name, Direction: d, Index: r.index}
				b.refKey = uint64(p.ord)<<32 | uint64(r.index)
				c.appendRule(b, r, d, ports)
			}
		}
		rs.Allowed = b.sorted()
	}
	if len(c.cluster) > 0 {
		b.refKey = 0
		c.clusterRules(&out, b, c.nsLabels[pod.Namespace], podLabels, subjectPorts)
	}
	return out
}

// appendRule adds the boxes rule r allows to b. subjectPorts are the
// subject's named ports (ingress: the destination is the subject).
func (c *Compiler) appendRule(b *builder, r *rule, d netpol.Direction, subjectPorts []containerPort) {
	// Addresses of the peers, with the ports that do not depend on them.
	forPrefixes := func(ps []netip.Prefix) {
		for _, pfx := range ps {
			if r.anyPort {
				b.add(pfx, netpol.ProtoAny, 0, 65535)
				continue
			}
			for _, pr := range r.fixed {
				b.add(pfx, pr.proto, pr.from, pr.to)
			}
			if d == netpol.Ingress {
				for _, np := range r.named {
					for _, cp := range subjectPorts {
						if np.matches(cp) {
							b.add(pfx, cp.proto, cp.num, cp.num)
						}
					}
				}
			}
		}
	}
	if r.allPeers {
		forPrefixes(anyAddress)
	}
	for _, bl := range r.blocks {
		forPrefixes(bl)
	}
	for _, s := range r.selected {
		for _, p := range c.resolve(s) {
			forPrefixes(p.prefixes)
		}
	}
	if d == netpol.Ingress || len(r.named) == 0 {
		return
	}
	// Egress named ports: resolved on each destination pod.
	named := func(p *peerPod, inside func(netip.Prefix) bool) {
		for _, np := range r.named {
			for _, cp := range p.ports {
				if !np.matches(cp) {
					continue
				}
				for _, pfx := range p.prefixes {
					if inside(pfx) {
						b.add(pfx, cp.proto, cp.num, cp.num)
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
	for _, bl := range r.blocks {
		in := func(pfx netip.Prefix) bool {
			for _, bp := range bl {
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
}

// builder collects one direction's boxes. Sorting a big Allow with
// string fields dominated a recompile, so each box also gets a small
// integer key in the same order (address family, address, length,
// protocol, ports, then policy namespace/name and rule index through the
// policy's ordinal); the keys are sorted and the output built once, at
// its exact size. Builders are pooled across Pod calls.
type builder struct {
	allows []netpol.Allow
	keys   []boxKey
	ref    netpol.RuleRef // of the rule being added
	refKey uint64
}

type boxKey struct {
	hi, lo uint64
	meta   uint64 // family<<63 | bits<<40 | proto<<32 | from<<16 | to
	rule   uint64
	i      int32 // index into allows
}

var builders = sync.Pool{New: func() any { return new(builder) }}

func (b *builder) reset() {
	b.allows, b.keys = b.allows[:0], b.keys[:0]
}

func (b *builder) add(peer netip.Prefix, proto netpol.Protocol, from, to uint16) {
	a16 := peer.Addr().As16()
	k := boxKey{
		hi:   binary.BigEndian.Uint64(a16[:8]),
		lo:   binary.BigEndian.Uint64(a16[8:]),
		meta: uint64(peer.Bits())<<40 | uint64(proto)<<32 | uint64(from)<<16 | uint64(to),
		rule: b.refKey,
		i:    int32(len(b.allows)),
	}
	if peer.Addr().Is6() {
		k.meta |= 1 << 63
	}
	b.keys = append(b.keys, k)
	b.allows = append(b.allows, netpol.Allow{Entry: netpol.Entry{Peer: peer, Proto: proto, From: from, To: to}, Rule: b.ref})
}

// sorted returns the boxes sorted and de-duplicated, so that Pod's
// output is deterministic (renderers diff it).
func (b *builder) sorted() []netpol.Allow {
	return distinct(b, func(a netpol.Allow) netpol.Allow { return a })
}

// sortedEntries is sorted for a tier rule: the boxes without their rule
// (all the same).
func (b *builder) sortedEntries() []netpol.Entry {
	return distinct(b, func(a netpol.Allow) netpol.Entry { return a.Entry })
}

// distinct sorts b's boxes and returns each distinct one through pick.
func distinct[T any](b *builder, pick func(netpol.Allow) T) []T {
	n := b.sortKeys()
	if n == 0 {
		return nil
	}
	out := make([]T, 0, n)
	for j, k := range b.keys {
		if j == 0 || !k.same(b.keys[j-1]) {
			out = append(out, pick(b.allows[k.i]))
		}
	}
	return out
}

// sortKeys sorts the keys and returns how many are distinct.
func (b *builder) sortKeys() int {
	if len(b.keys) == 0 {
		return 0
	}
	slices.SortFunc(b.keys, compareKey)
	n := 1
	for j := 1; j < len(b.keys); j++ {
		if !b.keys[j].same(b.keys[j-1]) {
			n++
		}
	}
	return n
}

// compareKey orders keys; written out because cmp.Or evaluates every
// comparison and this is the compiler's hot loop.
func compareKey(x, y boxKey) int {
	if f, g := x.meta>>63, y.meta>>63; f != g {
		return cmp.Compare(f, g)
	}
	if x.hi != y.hi {
		return cmp.Compare(x.hi, y.hi)
	}
	if x.lo != y.lo {
		return cmp.Compare(x.lo, y.lo)
	}
	if x.meta != y.meta {
		return cmp.Compare(x.meta, y.meta)
	}
	return cmp.Compare(x.rule, y.rule)
}

func (k boxKey) same(o boxKey) bool {
	return k.hi == o.hi && k.lo == o.lo && k.meta == o.meta && k.rule == o.rule
}
