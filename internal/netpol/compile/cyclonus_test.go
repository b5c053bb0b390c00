package compile

// A differential test against cyclonus's policy matcher (test-only use of
// github.com/mattfenwick/cyclonus/pkg/matcher): random namespaces, pods,
// container ports and NetworkPolicies, random flows between pods and
// outside addresses; our compiled Check must agree with the matcher.
//
// One known divergence is kept out of the generator, not papered over:
// cyclonus treats "key NotIn (...)" as false when the key is absent,
// Kubernetes' label selectors (which we use) as true. So NotIn is only
// generated on keys every object carries; TestFlows covers the absent
// key with Kubernetes' semantics.

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/mattfenwick/cyclonus/pkg/matcher"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

var (
	diffSeed  = flag.Uint64("cyclonus.seed", 20261201, "seed of the differential test against cyclonus")
	diffCases = flag.Int("cyclonus.cases", 10000, "policy sets in the differential test (each checked on several flows)")
)

const flowsPerCase = 4

func TestCyclonusDifferential(t *testing.T) {
	seed := *diffSeed
	t.Logf("seed %d (rerun with -cyclonus.seed=%d), %d policy sets x %d flows", seed, seed, *diffCases, flowsPerCase)
	rng := rand.New(rand.NewPCG(seed, 0))
	mismatches := 0
	var st stats
	for i := range *diffCases {
		mismatches += diffCase(t, rng, fmt.Sprintf("seed %d case %d", seed, i), mismatches < 5, &st)
	}
	t.Logf("flows: %d allowed, %d denied; %d isolated by a policy and allowed by a rule", st.allowed, st.denied, st.ruleAllowed)
	if mismatches > 0 {
		t.Errorf("%d of %d flows disagree with cyclonus (first 5 printed)", mismatches, *diffCases*flowsPerCase)
	}
}

// FuzzCyclonusDifferential explores seeds beyond the fixed one.
func FuzzCyclonusDifferential(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Add(uint64(20261201), uint64(7))
	f.Fuzz(func(t *testing.T, a, b uint64) {
		if n := diffCase(t, rand.New(rand.NewPCG(a, b)), fmt.Sprintf("fuzz seed %d,%d", a, b), true, &stats{}); n > 0 {
			t.Fail()
		}
	})
}

// diffCase generates one world and policy set and checks flowsPerCase
// flows; it returns the number of disagreements, printing them if verbose.
func diffCase(t *testing.T, rng *rand.Rand, name string, verbose bool, st *stats) int {
	g := gen{rng}
	nss, ps := g.world()
	var policies []*networkingv1.NetworkPolicy
	for j := range 1 + rng.IntN(4) {
		policies = append(policies, g.policy(j, nss))
	}
	c := New(Input{NetworkPolicies: policies, Pods: ps, Namespaces: nss})
	if errs := c.Errors(); len(errs) > 0 {
		t.Fatalf("%s: compile errors: %v", name, errs)
	}
	oracle := matcher.BuildNetworkPolicies(false, policies)
	nsLabels := map[string]map[string]string{}
	for _, ns := range nss {
		nsLabels[ns.Name] = ns.Labels
	}
	bad := 0
	for range flowsPerCase {
		v6 := rng.IntN(4) == 0 // a flow is IPv4 or IPv6 end to end
		src, dst := g.endpoint(ps, v6), g.endpoint(ps, v6)
		for src.pod == nil && dst.pod == nil {
			dst = g.endpoint(ps, v6)
		}
		proto := protocols[rng.IntN(3)]
		port := []int{53, 80, 81, 8000, 8080, 8081}[rng.IntN(6)]
		if dst.pod != nil && rng.IntN(2) == 0 { // mostly a port the destination serves
			cps := dst.pod.Spec.Containers[0].Ports
			cp := cps[rng.IntN(len(cps))]
			port, proto = int(cp.ContainerPort), cp.Protocol
		}
		ours, why := ourVerdict(c, src, dst, proto, port)
		traffic := &matcher.Traffic{
			Source:       src.traffic(nsLabels),
			Destination:  dst.traffic(nsLabels),
			ResolvedPort: port, ResolvedPortName: dst.portName(port, proto), Protocol: proto,
		}
		res := oracle.IsTrafficAllowed(traffic)
		st.count(ours, why)
		if ours == res.IsAllowed() {
			continue
		}
		bad++
		if verbose {
			var b strings.Builder
			for _, np := range policies {
				y, _ := yaml.Marshal(np)
				fmt.Fprintf(&b, "---\n%s", y)
			}
			t.Errorf("%s: %s -> %s %s/%d: ours allowed=%v (%s), cyclonus %v\npolicies:\n%s\nworld:\n%s\ncyclonus:\n%s",
				name, src, dst, proto, port, ours, why, res.IsAllowed(), b.String(), describeWorld(nss, ps), res.Table())
		}
	}
	return bad
}

// stats shows the generator exercises both verdicts and the rules.
type stats struct{ allowed, denied, ruleAllowed int }

func (s *stats) count(allowed bool, why string) {
	if allowed {
		s.allowed++
	} else {
		s.denied++
	}
	if allowed && strings.Contains(why, "allowed by NetworkPolicy") {
		s.ruleAllowed++
	}
}

// endpoint is a flow's end: a pod, or an address outside the cluster.
type endpoint struct {
	pod *corev1.Pod
	ip  string
}

func (e endpoint) String() string {
	if e.pod == nil {
		return e.ip
	}
	return fmt.Sprintf("%s/%s(%s)", e.pod.Namespace, e.pod.Name, e.ip)
}

func (e endpoint) traffic(nsLabels map[string]map[string]string) *matcher.TrafficPeer {
	tp := &matcher.TrafficPeer{IP: e.ip}
	if e.pod != nil {
		tp.Internal = &matcher.InternalPeer{PodLabels: e.pod.Labels, Namespace: e.pod.Namespace, NamespaceLabels: nsLabels[e.pod.Namespace]}
	}
	return tp
}

// portName is the destination's name for port/proto, as a prober's
// ResolvedPortName: the container port with that number and protocol.
func (e endpoint) portName(port int, proto corev1.Protocol) string {
	if e.pod == nil {
		return ""
	}
	for _, cp := range e.pod.Spec.Containers[0].Ports {
		if int(cp.ContainerPort) == port && cp.Protocol == proto {
			return cp.Name
		}
	}
	return ""
}

func ourVerdict(c *Compiler, src, dst endpoint, proto corev1.Protocol, port int) (bool, string) {
	p, _ := protocol(proto)
	var why []string
	ok := true
	if src.pod != nil {
		sp := c.Pod(src.pod)
		d := sp.Egress.Check(netip.MustParseAddr(dst.ip), p, uint16(port))
		ok = ok && d.Allowed
		why = append(why, "egress "+d.String())
	}
	if dst.pod != nil {
		dp := c.Pod(dst.pod)
		d := dp.Ingress.Check(netip.MustParseAddr(src.ip), p, uint16(port))
		ok = ok && d.Allowed
		why = append(why, "ingress "+d.String())
	}
	return ok, strings.Join(why, "; ")
}

func describeWorld(nss []*corev1.Namespace, ps []*corev1.Pod) string {
	var b strings.Builder
	for _, ns := range nss {
		fmt.Fprintf(&b, "namespace %s %v\n", ns.Name, ns.Labels)
	}
	for _, p := range ps {
		var ports []string
		for _, cp := range p.Spec.Containers[0].Ports {
			ports = append(ports, fmt.Sprintf("%s=%d/%s", cp.Name, cp.ContainerPort, cp.Protocol))
		}
		fmt.Fprintf(&b, "pod %s/%s %s %v ports %v\n", p.Namespace, p.Name, p.Status.PodIP, p.Labels, ports)
	}
	return b.String()
}

// gen draws worlds, policies and flows.
type gen struct{ r *rand.Rand }

func (g gen) pick(s ...string) string { return s[g.r.IntN(len(s))] }

var (
	protocols    = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
	portNames    = []string{"http", "alt", "dns"}
	portNums     = []int32{53, 80, 81, 8080}
	externalIP   = []string{"192.168.1.1", "10.0.1.200", "198.51.100.7", "10.0.2.250"}
	externalIPv6 = []string{"2001:db8::1", "fd00:0:0:1::c8", "fd00:0:0:2::fa"}
)

// world: namespaces x, y, z (label ns always; team sometimes) and pods
// a, b, c in each (label pod always; app and tier sometimes), each with a
// few container ports, names reused with different numbers across pods.
func (g gen) world() ([]*corev1.Namespace, []*corev1.Pod) {
	var nss []*corev1.Namespace
	var ps []*corev1.Pod
	for i, ns := range []string{"x", "y", "z"} {
		n := mkNS(ns, "ns", ns)
		if g.r.IntN(2) == 0 {
			n.Labels["team"] = g.pick("red", "blue")
		}
		nss = append(nss, n)
		for j, name := range []string{"a", "b", "c"} {
			l := labelsOf("pod", name)
			if g.r.IntN(2) == 0 {
				l["app"] = g.pick("web", "db")
			}
			if g.r.IntN(3) == 0 {
				l["tier"] = g.pick("1", "2")
			}
			var cps []corev1.ContainerPort
			usedName, usedPort := map[string]bool{}, map[string]bool{}
			for range 1 + g.r.IntN(4) {
				cp := corev1.ContainerPort{ContainerPort: portNums[g.r.IntN(len(portNums))], Protocol: protocols[g.r.IntN(3)]}
				if g.r.IntN(4) != 0 {
					cp.Name = portNames[g.r.IntN(len(portNames))]
				}
				key := fmt.Sprintf("%d/%s", cp.ContainerPort, cp.Protocol)
				if usedPort[key] || (cp.Name != "" && usedName[cp.Name]) {
					continue
				}
				usedPort[key], usedName[cp.Name] = true, cp.Name != ""
				cps = append(cps, cp)
			}
			ips := []string{fmt.Sprintf("10.0.%d.%d", i+1, j+1), fmt.Sprintf("fd00:0:0:%d::%d", i+1, j+1)}
			ps = append(ps, mkPod(ns+"/"+name, ips, l, cps...))
		}
	}
	return nss, ps
}

// endpoint draws a pod (dual-stack: its address of the flow's family)
// or an outside address.
func (g gen) endpoint(ps []*corev1.Pod, v6 bool) endpoint {
	if g.r.IntN(5) == 0 {
		if v6 {
			return endpoint{ip: externalIPv6[g.r.IntN(len(externalIPv6))]}
		}
		return endpoint{ip: externalIP[g.r.IntN(len(externalIP))]}
	}
	p := ps[g.r.IntN(len(ps))]
	if v6 {
		return endpoint{pod: p, ip: p.Status.PodIPs[1].IP}
	}
	return endpoint{pod: p, ip: p.Status.PodIP}
}

// podSelector draws a pod selector; empty is a real choice ({} = all).
func (g gen) podSelector() *metav1.LabelSelector {
	switch g.r.IntN(7) {
	case 0:
		return &metav1.LabelSelector{}
	case 1:
		return sel("pod", g.pick("a", "b", "c"))
	case 2:
		return sel("app", g.pick("web", "db"))
	case 3:
		return expr("pod", metav1.LabelSelectorOpIn, g.pick("a", "b"), g.pick("b", "c"))
	case 4:
		return expr("pod", metav1.LabelSelectorOpNotIn, g.pick("a", "b", "c")) // "pod" is on every pod
	case 5:
		return expr(g.pick("app", "tier"), metav1.LabelSelectorOpExists)
	}
	s := expr(g.pick("app", "tier"), metav1.LabelSelectorOpDoesNotExist)
	s.MatchLabels = map[string]string{"pod": g.pick("a", "b", "c")}
	return s
}

func (g gen) nsSelector() *metav1.LabelSelector {
	switch g.r.IntN(6) {
	case 0:
		return &metav1.LabelSelector{}
	case 1:
		return sel("ns", g.pick("x", "y", "z"))
	case 2:
		return sel("kubernetes.io/metadata.name", g.pick("x", "y", "z"))
	case 3:
		return expr("ns", metav1.LabelSelectorOpNotIn, g.pick("x", "y")) // "ns" is on every namespace
	case 4:
		return expr("team", metav1.LabelSelectorOpIn, g.pick("red", "blue"))
	}
	return expr("team", metav1.LabelSelectorOperator(g.pick(string(metav1.LabelSelectorOpExists), string(metav1.LabelSelectorOpDoesNotExist))))
}

func (g gen) peer() networkingv1.NetworkPolicyPeer {
	switch g.r.IntN(5) {
	case 0:
		cidr := g.pick("10.0.0.0/16", "10.0.1.0/24", "10.0.2.0/23", "10.0.2.2/32", "0.0.0.0/0", "192.168.0.0/16", "10.0.0.0/8",
			"fd00::/16", "fd00:0:0:1::/64", "::/0", "2001:db8::/32")
		var except []string
		p := netip.MustParsePrefix(cidr)
		for _, e := range []string{"10.0.1.0/24", "10.0.2.2/32", "10.0.3.0/25", "10.0.1.1/32", "192.168.1.0/24", "10.0.2.0/24",
			"fd00:0:0:2::/64", "fd00:0:0:1::1/128", "fd00:0:0:1::/120"} {
			ep := netip.MustParsePrefix(e)
			if ep.Bits() > p.Bits() && p.Contains(ep.Addr()) && g.r.IntN(3) == 0 {
				except = append(except, e)
			}
		}
		return block(cidr, except...)
	case 1:
		return pods(g.podSelector(), nil)
	case 2:
		return pods(nil, g.nsSelector())
	}
	return pods(g.podSelector(), g.nsSelector())
}

func (g gen) port() networkingv1.NetworkPolicyPort {
	var proto corev1.Protocol // unset: TCP
	if g.r.IntN(3) != 0 {
		proto = protocols[g.r.IntN(3)]
	}
	switch g.r.IntN(6) {
	case 0:
		return pp(proto, 0, 0)
	case 1, 2:
		return pp(proto, portNames[g.r.IntN(len(portNames))], 0)
	case 3:
		lo := []int32{53, 80, 8000}[g.r.IntN(3)]
		return pp(proto, int(lo), lo+[]int32{0, 1, 80}[g.r.IntN(3)])
	}
	return pp(proto, int(portNums[g.r.IntN(len(portNums))]), 0)
}

func (g gen) policy(i int, nss []*corev1.Namespace) *networkingv1.NetworkPolicy {
	ns := nss[g.r.IntN(len(nss))].Name
	types := [][]networkingv1.PolicyType{ingressOnly, egressOnly, both}[g.r.IntN(3)]
	np := mkNP(fmt.Sprintf("%s/p%d", ns, i), g.podSelector(), types)
	rule := func() ([]networkingv1.NetworkPolicyPort, []networkingv1.NetworkPolicyPeer) {
		var ports []networkingv1.NetworkPolicyPort
		var peers []networkingv1.NetworkPolicyPeer
		for range g.r.IntN(3) {
			ports = append(ports, g.port())
		}
		for range g.r.IntN(3) {
			peers = append(peers, g.peer())
		}
		return ports, peers
	}
	for range g.r.IntN(3) {
		ports, peers := rule()
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{Ports: ports, From: peers})
	}
	for range g.r.IntN(3) {
		ports, peers := rule()
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{Ports: ports, To: peers})
	}
	return np
}
