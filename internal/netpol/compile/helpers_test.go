package compile

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flatnet/flatnet/internal/netpol"
)

// Builders for compact test objects.

func mkNS(name string, kv ...string) *corev1.Namespace {
	l := map[string]string{"kubernetes.io/metadata.name": name} // as the apiserver sets it
	for i := 0; i+1 < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

// mkPod makes a running pod "ns/name" with the given addresses, labels
// (k=v pairs) and container ports.
func mkPod(nsName string, ips []string, lbls map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
	ns, name, _ := strings.Cut(nsName, "/")
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: ports}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	return p
}

func cport(name string, num int32, proto corev1.Protocol) corev1.ContainerPort {
	return corev1.ContainerPort{Name: name, ContainerPort: num, Protocol: proto}
}

func labelsOf(kv ...string) map[string]string {
	l := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return l
}

func sel(kv ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: labelsOf(kv...)}
}

func expr(key string, op metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	both        = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
)

type policyOpt func(*networkingv1.NetworkPolicy)

func mkNP(nsName string, subject *metav1.LabelSelector, types []networkingv1.PolicyType, opts ...policyOpt) *networkingv1.NetworkPolicy {
	ns, name, _ := strings.Cut(nsName, "/")
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: *subject, PolicyTypes: types},
	}
	for _, o := range opts {
		o(np)
	}
	return np
}

func in(ports []networkingv1.NetworkPolicyPort, from ...networkingv1.NetworkPolicyPeer) policyOpt {
	return func(np *networkingv1.NetworkPolicy) {
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{Ports: ports, From: from})
	}
}

func out(ports []networkingv1.NetworkPolicyPort, to ...networkingv1.NetworkPolicyPeer) policyOpt {
	return func(np *networkingv1.NetworkPolicy) {
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{Ports: ports, To: to})
	}
}

func pods(podSel, nsSel *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: podSel, NamespaceSelector: nsSel}
}

func block(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func ports(ps ...networkingv1.NetworkPolicyPort) []networkingv1.NetworkPolicyPort { return ps }

// pp is a policy port: port 0 means none, a string a name, end 0 no endPort;
// proto "" leaves the protocol unset (TCP).
func pp(proto corev1.Protocol, port any, end int32) networkingv1.NetworkPolicyPort {
	var p networkingv1.NetworkPolicyPort
	if proto != "" {
		p.Protocol = &proto
	}
	switch v := port.(type) {
	case int:
		if v != 0 {
			p.Port = new(intstr.FromInt32(int32(v)))
		}
	case string:
		p.Port = new(intstr.FromString(v))
	}
	if end != 0 {
		p.EndPort = &end
	}
	return p
}

// world is namespaces x, y, z (labels ns=<name>) and pods a, b, c in each
// (label pod=<name>), at 10.0.<1..3>.<1..3>, each serving 80/81 TCP, 80 UDP
// and 80 SCTP under the upstream e2e suite's port names.
func world() ([]*corev1.Namespace, []*corev1.Pod) {
	var nss []*corev1.Namespace
	var ps []*corev1.Pod
	for i, ns := range []string{"x", "y", "z"} {
		nss = append(nss, mkNS(ns, "ns", ns))
		for j, p := range []string{"a", "b", "c"} {
			ps = append(ps, mkPod(ns+"/"+p, []string{fmt.Sprintf("10.0.%d.%d", i+1, j+1)}, labelsOf("pod", p),
				cport("serve-80-tcp", 80, corev1.ProtocolTCP), cport("serve-81-tcp", 81, ""),
				cport("serve-80-udp", 80, corev1.ProtocolUDP), cport("serve-80-sctp", 80, corev1.ProtocolSCTP)))
		}
	}
	return nss, ps
}

// flow is one connection: from and to are "ns/pod" names or addresses
// outside the cluster.
type flow struct {
	from, to string
	proto    netpol.Protocol
	port     uint16
	want     bool
}

func (f flow) String() string {
	return fmt.Sprintf("%s -> %s %s/%d", f.from, f.to, f.proto, f.port)
}

// allowed decides f as the datapath would: the source's egress and the
// destination's ingress must both allow it.
func allowed(t *testing.T, c *Compiler, byName map[string]*corev1.Pod, f flow) bool {
	t.Helper()
	end := func(s string) (netip.Addr, *corev1.Pod) {
		if p, ok := byName[s]; ok {
			return netip.MustParseAddr(p.Status.PodIPs[0].IP), p
		}
		return netip.MustParseAddr(s), nil
	}
	srcIP, src := end(f.from)
	dstIP, dst := end(f.to)
	ok := true
	if src != nil {
		sp := c.Pod(src)
		ok = ok && sp.Egress.Check(dstIP, f.proto, f.port).Allowed
	}
	if dst != nil {
		dp := c.Pod(dst)
		ok = ok && dp.Ingress.Check(srcIP, f.proto, f.port).Allowed
	}
	return ok
}

func podIndex(ps []*corev1.Pod) map[string]*corev1.Pod {
	m := map[string]*corev1.Pod{}
	for _, p := range ps {
		m[p.Namespace+"/"+p.Name] = p
	}
	return m
}

// dump renders rules one line per box, for golden comparisons.
func dump(r *netpol.Rules) []string {
	var out []string
	for _, a := range r.Allowed {
		out = append(out, fmt.Sprintf("%s %s", a.Entry, a.Rule))
	}
	return out
}
