package compile

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/netpol"
)

const (
	tcp  = netpol.ProtoTCP
	udp  = netpol.ProtoUDP
	sctp = netpol.ProtoSCTP
)

var all = &metav1.LabelSelector{}

// TestFlows checks each field of NetworkPolicy v1 and each known pain
// point by the flows it allows and denies over the x/y/z × a/b/c world.
func TestFlows(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		pods     []*corev1.Pod       // added to the world
		nss      []*corev1.Namespace // added to the world
		flows    []flow
	}{
		{
			name: "no policy allows everything",
			flows: []flow{
				{"x/a", "y/b", tcp, 80, true}, {"x/a", "y/b", udp, 53, true}, {"198.51.100.1", "x/a", sctp, 80, true},
				{"x/a", "198.51.100.1", tcp, 443, true},
			},
		},
		{
			name:     "default deny ingress isolates only ingress",
			policies: []*networkingv1.NetworkPolicy{mkNP("x/deny", all, ingressOnly)},
			flows: []flow{
				{"y/a", "x/a", tcp, 80, false}, {"x/b", "x/a", udp, 80, false}, {"198.51.100.1", "x/a", tcp, 80, false},
				{"x/a", "y/a", tcp, 80, true}, {"x/a", "198.51.100.1", tcp, 80, true}, {"y/a", "y/b", tcp, 80, true},
			},
		},
		{
			name:     "default deny all",
			policies: []*networkingv1.NetworkPolicy{mkNP("x/deny", all, both)},
			flows:    []flow{{"x/a", "x/b", tcp, 80, false}, {"x/a", "y/a", tcp, 80, false}, {"y/a", "x/a", tcp, 80, false}, {"y/a", "y/b", tcp, 80, true}},
		},
		{
			name: "allow all ingress beside a default deny (union)",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/deny", all, ingressOnly),
				mkNP("x/allow", all, ingressOnly, in(nil)),
			},
			flows: []flow{{"y/a", "x/a", tcp, 80, true}, {"198.51.100.1", "x/a", sctp, 9, true}},
		},
		{
			name:     "allow all egress",
			policies: []*networkingv1.NetworkPolicy{mkNP("x/allow", all, egressOnly, out(nil))},
			flows:    []flow{{"x/a", "198.51.100.1", udp, 53, true}, {"x/a", "y/a", sctp, 80, true}},
		},
		{
			name: "policyTypes default: egress rules make it isolate egress",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", sel("pod", "a"), nil, out(ports(pp("", 80, 0)))),
			},
			flows: []flow{
				{"y/a", "x/a", tcp, 81, false}, // Ingress is always a default
				{"x/a", "y/b", tcp, 80, true}, {"x/a", "y/b", tcp, 81, false},
			},
		},
		{
			name:     "policyTypes default: no egress rules, egress stays open",
			policies: []*networkingv1.NetworkPolicy{mkNP("x/p", sel("pod", "a"), nil)},
			flows:    []flow{{"y/a", "x/a", tcp, 80, false}, {"x/a", "y/b", tcp, 81, true}},
		},
		{
			name: "rules of a direction missing from policyTypes are ignored",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", sel("pod", "a"), egressOnly, in(nil), out(ports(pp("", 80, 0)))),
			},
			flows: []flow{{"y/a", "x/a", tcp, 81, true}, {"x/a", "y/a", tcp, 81, false}},
		},
		{
			name: "podSelector only: same namespace",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", sel("pod", "a"), ingressOnly, in(nil, pods(sel("pod", "b"), nil))),
			},
			flows: []flow{
				{"x/b", "x/a", tcp, 80, true}, {"y/b", "x/a", tcp, 80, false}, {"x/c", "x/a", tcp, 80, false},
				{"x/c", "x/b", tcp, 80, true}, // x/b not selected
			},
		},
		{
			name: "namespaceSelector only: every pod there",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(nil, pods(nil, sel("ns", "y")))),
			},
			flows: []flow{{"y/a", "x/a", tcp, 80, true}, {"y/c", "x/b", udp, 80, true}, {"z/a", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 80, false}},
		},
		{
			name: "empty namespaceSelector: all namespaces, labelled or not",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(nil, pods(sel("pod", "b"), all))),
			},
			pods: []*corev1.Pod{mkPod("w/b", []string{"10.0.4.2"}, labelsOf("pod", "b"))}, // no Namespace object
			flows: []flow{
				{"y/b", "x/a", tcp, 80, true}, {"z/b", "x/a", tcp, 80, true}, {"x/b", "x/a", tcp, 80, true}, {"w/b", "x/a", tcp, 80, true},
				{"y/a", "x/a", tcp, 80, false}, {"198.51.100.1", "x/a", tcp, 80, false},
			},
		},
		{
			name: "namespace labels come from Namespace objects only",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(nil, pods(nil, sel("kubernetes.io/metadata.name", "w")))),
			},
			pods:  []*corev1.Pod{mkPod("w/b", []string{"10.0.4.2"}, labelsOf("pod", "b"))},
			flows: []flow{{"w/b", "x/a", tcp, 80, false}},
		},
		{
			name: "namespaceSelector and podSelector in one peer: AND",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(nil, pods(sel("pod", "b"), sel("ns", "y")))),
			},
			flows: []flow{{"y/b", "x/a", tcp, 80, true}, {"y/a", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 80, false}, {"z/b", "x/a", tcp, 80, false}},
		},
		{
			name: "two peers: OR",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(nil, pods(sel("pod", "b"), nil), pods(nil, sel("ns", "y")))),
			},
			flows: []flow{{"x/b", "x/a", tcp, 80, true}, {"y/a", "x/a", tcp, 80, true}, {"z/b", "x/a", tcp, 80, false}},
		},
		{
			name: "matchExpressions In and NotIn (NotIn also matches pods without the key)",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(nil, pods(expr("pod", metav1.LabelSelectorOpIn, "b", "c"), expr("ns", metav1.LabelSelectorOpNotIn, "x", "z")))),
			},
			nss:  []*corev1.Namespace{mkNS("w")},
			pods: []*corev1.Pod{mkPod("w/b", []string{"10.0.4.2"}, labelsOf("pod", "b"))},
			flows: []flow{
				{"y/b", "x/a", tcp, 80, true}, {"y/c", "x/a", tcp, 80, true}, {"y/a", "x/a", tcp, 80, false},
				{"z/b", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 80, false},
				{"w/b", "x/a", tcp, 80, true}, // w has no "ns" label
			},
		},
		{
			name: "matchExpressions Exists and DoesNotExist",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", expr("pod", metav1.LabelSelectorOpExists), ingressOnly, in(nil, pods(expr("tier", metav1.LabelSelectorOpDoesNotExist), nil))),
			},
			pods: []*corev1.Pod{
				mkPod("x/t", []string{"10.0.1.9"}, labelsOf("tier", "db")),
				mkPod("x/u", []string{"10.0.1.10"}, nil),
			},
			flows: []flow{
				{"x/b", "x/a", tcp, 80, true}, {"x/u", "x/a", tcp, 80, true}, {"x/t", "x/a", tcp, 80, false},
				{"y/a", "x/t", tcp, 80, true}, // x/t has no pod label: not selected
			},
		},
		{
			name: "ipBlock except is no deny: a second policy re-allows",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/cidr", all, egressOnly, out(nil, block("10.0.0.0/16", "10.0.2.0/24"))),
				mkNP("x/again", all, egressOnly, out(nil, block("10.0.2.2/32"))),
			},
			flows: []flow{
				{"x/a", "z/c", tcp, 80, true}, {"x/a", "y/a", tcp, 80, false}, {"x/a", "y/b", tcp, 80, true},
				{"x/a", "10.1.0.1", tcp, 80, false},
			},
		},
		{
			name: "ipBlock except within one rule, ingress from outside",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(ports(pp("", 80, 0)), block("198.51.100.0/24", "198.51.100.128/25"))),
			},
			flows: []flow{{"198.51.100.1", "x/a", tcp, 80, true}, {"198.51.100.200", "x/a", tcp, 80, false}, {"198.51.100.1", "x/a", tcp, 81, false}},
		},
		{
			name:     "port by number: protocol defaults to TCP",
			policies: []*networkingv1.NetworkPolicy{mkNP("x/p", all, ingressOnly, in(ports(pp("", 80, 0))))},
			flows: []flow{
				{"y/a", "x/a", tcp, 80, true}, {"y/a", "x/a", udp, 80, false}, {"y/a", "x/a", sctp, 80, false},
				{"y/a", "x/a", tcp, 81, false}, {"198.51.100.1", "x/a", tcp, 80, true},
			},
		},
		{
			name:     "protocol without a port: every port of it",
			policies: []*networkingv1.NetworkPolicy{mkNP("x/p", all, ingressOnly, in(ports(pp(corev1.ProtocolUDP, 0, 0))))},
			flows:    []flow{{"y/a", "x/a", udp, 1, true}, {"y/a", "x/a", udp, 65535, true}, {"y/a", "x/a", tcp, 80, false}},
		},
		{
			name: "rule without ports: every protocol",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(nil, pods(sel("pod", "b"), nil))),
			},
			flows: []flow{{"x/b", "x/a", tcp, 1, true}, {"x/b", "x/a", udp, 53, true}, {"x/b", "x/a", sctp, 80, true}},
		},
		{
			name: "endPort range",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(ports(pp(corev1.ProtocolTCP, 8000, 8080)))),
			},
			flows: []flow{{"y/a", "x/a", tcp, 8000, true}, {"y/a", "x/a", tcp, 8080, true}, {"y/a", "x/a", tcp, 7999, false}, {"y/a", "x/a", tcp, 8081, false}, {"y/a", "x/a", udp, 8000, false}},
		},
		{
			name: "SCTP-only policy never opens TCP",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(ports(pp(corev1.ProtocolSCTP, 80, 0)))),
			},
			flows: []flow{{"y/a", "x/a", sctp, 80, true}, {"y/a", "x/a", tcp, 80, false}, {"y/a", "x/a", udp, 80, false}},
		},
		{
			name: "named port on ingress: the subject's number",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(ports(pp("", "web", 0)))),
			},
			pods: []*corev1.Pod{
				mkPod("x/w1", []string{"10.0.1.21"}, nil, cport("web", 8080, corev1.ProtocolTCP)),
				mkPod("x/w2", []string{"10.0.1.22"}, nil, cport("web", 9090, "")),
			},
			flows: []flow{
				{"y/a", "x/w1", tcp, 8080, true}, {"y/a", "x/w1", tcp, 9090, false},
				{"y/a", "x/w2", tcp, 9090, true}, {"y/a", "x/w2", tcp, 8080, false},
				{"y/a", "x/a", tcp, 80, false}, // x/a has no port named web
			},
		},
		{
			name: "named port of a sidecar resolves; of a plain init container not",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", sel("pod", "s"), ingressOnly, in(ports(pp("", "side", 0), pp("", "setup", 0)))),
			},
			pods:  []*corev1.Pod{withInit(mkPod("x/s", []string{"10.0.1.51"}, labelsOf("pod", "s")))},
			flows: []flow{{"y/a", "x/s", tcp, 9000, true}, {"y/a", "x/s", tcp, 9001, false}},
		},
		{
			name: "named port needs the protocol too",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", all, ingressOnly, in(ports(pp(corev1.ProtocolUDP, "serve-80-tcp", 0), pp(corev1.ProtocolUDP, "serve-80-udp", 0)))),
			},
			flows: []flow{{"y/a", "x/a", udp, 80, true}, {"y/a", "x/a", tcp, 80, false}},
		},
		{
			name: "named port on egress: per peer, numbers differ",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", sel("pod", "a"), egressOnly, out(ports(pp("", "web", 0)), pods(nil, all))),
			},
			pods: []*corev1.Pod{
				mkPod("y/w1", []string{"10.0.2.21"}, nil, cport("web", 8080, corev1.ProtocolTCP)),
				mkPod("z/w2", []string{"10.0.3.22"}, nil, cport("web", 9090, corev1.ProtocolTCP)),
			},
			flows: []flow{
				{"x/a", "y/w1", tcp, 8080, true}, {"x/a", "y/w1", tcp, 9090, false},
				{"x/a", "z/w2", tcp, 9090, true}, {"x/a", "z/w2", tcp, 8080, false},
				{"x/a", "y/b", tcp, 8080, false},
			},
		},
		{
			name: "named port on egress to an ipBlock: pods inside with the name, never outside addresses",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", sel("pod", "a"), egressOnly, out(ports(pp("", "serve-81-tcp", 0)), block("10.0.0.0/8", "10.0.3.0/24"))),
			},
			flows: []flow{
				{"x/a", "y/b", tcp, 81, true}, {"x/a", "z/b", tcp, 81, false}, {"x/a", "y/b", tcp, 80, false},
				{"x/a", "10.9.9.9", tcp, 81, false},
			},
		},
		{
			name: "named port on egress with no peers: any pod with the name",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", sel("pod", "a"), egressOnly, out(ports(pp(corev1.ProtocolSCTP, "serve-80-sctp", 0)))),
			},
			flows: []flow{{"x/a", "z/c", sctp, 80, true}, {"x/a", "z/c", tcp, 80, false}, {"x/a", "198.51.100.1", sctp, 80, false}},
		},
		{
			// kube-dns's Service maps 53 to the pods' named port "dns"
			// (5353 here); policy is checked after DNAT, so it must open
			// the pod port for both UDP and TCP.
			name: "DNS egress to the kube-dns pods after DNAT",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/deny", all, egressOnly),
				mkNP("x/dns", all, egressOnly, out(
					ports(pp(corev1.ProtocolUDP, "dns", 0), pp(corev1.ProtocolTCP, "dns-tcp", 0)),
					pods(sel("k8s-app", "kube-dns"), sel("kubernetes.io/metadata.name", "kube-system")))),
			},
			nss: []*corev1.Namespace{mkNS("kube-system")},
			pods: []*corev1.Pod{
				mkPod("kube-system/coredns-1", []string{"10.0.9.2"}, labelsOf("k8s-app", "kube-dns"),
					cport("dns", 5353, corev1.ProtocolUDP), cport("dns-tcp", 5353, corev1.ProtocolTCP), cport("metrics", 9153, "")),
				mkPod("kube-system/other", []string{"10.0.9.3"}, labelsOf("k8s-app", "other"), cport("dns", 5353, corev1.ProtocolUDP)),
			},
			flows: []flow{
				{"x/a", "kube-system/coredns-1", udp, 5353, true}, {"x/a", "kube-system/coredns-1", tcp, 5353, true},
				{"x/a", "kube-system/coredns-1", udp, 53, false}, {"x/a", "kube-system/coredns-1", tcp, 9153, false},
				{"x/a", "kube-system/other", udp, 5353, false}, {"x/a", "y/a", udp, 53, false},
			},
		},
		{
			name: "DNS egress by number, both protocols",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/dns", all, egressOnly, out(ports(pp(corev1.ProtocolUDP, 53, 0), pp(corev1.ProtocolTCP, 53, 0)), pods(sel("k8s-app", "kube-dns"), all))),
			},
			nss:   []*corev1.Namespace{mkNS("kube-system")},
			pods:  []*corev1.Pod{mkPod("kube-system/coredns-1", []string{"10.0.9.2"}, labelsOf("k8s-app", "kube-dns"))},
			flows: []flow{{"x/a", "kube-system/coredns-1", udp, 53, true}, {"x/a", "kube-system/coredns-1", tcp, 53, true}, {"x/a", "kube-system/coredns-1", sctp, 53, false}},
		},
		{
			name: "hostNetwork pods are neither subjects nor peers by selector",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/deny", all, both),
				mkNP("y/p", all, ingressOnly, in(nil, pods(sel("role", "agent"), all))),
			},
			pods: []*corev1.Pod{hostNet(mkPod("x/host", []string{"192.168.50.1"}, labelsOf("role", "agent")))},
			flows: []flow{
				{"y/a", "x/host", tcp, 80, true}, // not isolated by x/deny
				{"x/host", "y/a", tcp, 80, false},
				{"192.168.50.1", "y/a", tcp, 80, false},
			},
		},
		{
			name: "pods without an address or finished are no peers; a deleting pod still is",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", sel("pod", "a"), ingressOnly, in(nil, pods(sel("peer", "yes"), nil))),
			},
			pods: []*corev1.Pod{
				phase(mkPod("x/done", []string{"10.0.1.31"}, labelsOf("peer", "yes")), corev1.PodSucceeded),
				phase(mkPod("x/failed", []string{"10.0.1.32"}, labelsOf("peer", "yes")), corev1.PodFailed),
				deleting(mkPod("x/going", []string{"10.0.1.33"}, labelsOf("peer", "yes"))),
			},
			flows: []flow{{"10.0.1.31", "x/a", tcp, 80, false}, {"10.0.1.32", "x/a", tcp, 80, false}, {"x/going", "x/a", tcp, 80, true}},
		},
		{
			name: "dual stack: peers by both addresses, any peer in both families",
			policies: []*networkingv1.NetworkPolicy{
				mkNP("x/p", sel("pod", "d"), both, in(nil, pods(sel("pod", "e"), nil)), out(ports(pp("", 443, 0)))),
			},
			pods: []*corev1.Pod{
				mkPod("x/d", []string{"10.0.1.41", "fd00::41"}, labelsOf("pod", "d")),
				mkPod("x/e", []string{"fd00::42", "10.0.1.42"}, labelsOf("pod", "e")),
			},
			flows: []flow{
				{"x/e", "x/d", tcp, 80, true}, {"fd00::42", "x/d", tcp, 80, true}, {"fd00::43", "x/d", tcp, 80, false},
				{"x/d", "2001:db8::1", tcp, 443, true}, {"x/d", "2001:db8::1", tcp, 80, false},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nss, ps := world()
			nss = append(nss, tc.nss...)
			ps = append(ps, tc.pods...)
			c := New(Input{NetworkPolicies: tc.policies, Pods: ps, Namespaces: nss})
			if errs := c.Errors(); len(errs) > 0 {
				t.Fatalf("errors: %v", errs)
			}
			idx := podIndex(ps)
			for _, f := range tc.flows {
				if got := allowed(t, c, idx, f); got != f.want {
					t.Errorf("%s: allowed=%v, want %v", f, got, f.want)
				}
			}
		})
	}
}

// withInit gives p a sidecar serving "side" on 9000 and a plain init
// container declaring "setup" on 9001.
func withInit(p *corev1.Pod) *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	p.Spec.InitContainers = []corev1.Container{
		{Name: "sidecar", RestartPolicy: &always, Ports: []corev1.ContainerPort{cport("side", 9000, "")}},
		{Name: "setup", Ports: []corev1.ContainerPort{cport("setup", 9001, "")}},
	}
	return p
}

func hostNet(p *corev1.Pod) *corev1.Pod { p.Spec.HostNetwork = true; return p }

func phase(p *corev1.Pod, ph corev1.PodPhase) *corev1.Pod { p.Status.Phase = ph; return p }

func deleting(p *corev1.Pod) *corev1.Pod {
	now := metav1.Now()
	p.DeletionTimestamp = &now
	return p
}

// TestPodOutput pins the exact boxes for the subtle cases: per-peer named
// port numbers, except as prefixes, Isolators, and sort order.
func TestPodOutput(t *testing.T) {
	nss, ps := world()
	ps = append(ps,
		mkPod("y/w1", []string{"10.0.2.21"}, labelsOf("app", "web"), cport("web", 8080, corev1.ProtocolTCP)),
		mkPod("z/w2", []string{"10.0.3.22", "fd00::22"}, labelsOf("app", "web"), cport("web", 9090, corev1.ProtocolTCP)),
		mkPod("z/nip", nil, labelsOf("app", "web"), cport("web", 7070, corev1.ProtocolTCP)),
	)
	policies := []*networkingv1.NetworkPolicy{
		mkNP("x/web", sel("pod", "a"), egressOnly, out(ports(pp("", "web", 0), pp(corev1.ProtocolUDP, 53, 0)), pods(sel("app", "web"), all))),
		mkNP("x/cidr", sel("pod", "a"), both, out(ports(pp(corev1.ProtocolSCTP, 80, 90)), block("10.0.0.0/16", "10.0.2.0/23", "10.0.64.0/18"))),
	}
	c := New(Input{NetworkPolicies: policies, Pods: ps, Namespaces: nss})
	got := c.Pod(podIndex(ps)["x/a"])
	want := []string{
		"10.0.0.0/23 sctp/80-90 NetworkPolicy x/cidr egress rule 0",
		"10.0.2.21/32 tcp/8080 NetworkPolicy x/web egress rule 0",
		"10.0.2.21/32 udp/53 NetworkPolicy x/web egress rule 0",
		"10.0.3.22/32 tcp/9090 NetworkPolicy x/web egress rule 0",
		"10.0.3.22/32 udp/53 NetworkPolicy x/web egress rule 0",
		"10.0.4.0/22 sctp/80-90 NetworkPolicy x/cidr egress rule 0",
		"10.0.8.0/21 sctp/80-90 NetworkPolicy x/cidr egress rule 0",
		"10.0.16.0/20 sctp/80-90 NetworkPolicy x/cidr egress rule 0",
		"10.0.32.0/19 sctp/80-90 NetworkPolicy x/cidr egress rule 0",
		"10.0.128.0/17 sctp/80-90 NetworkPolicy x/cidr egress rule 0",
		"fd00::22/128 tcp/9090 NetworkPolicy x/web egress rule 0",
		"fd00::22/128 udp/53 NetworkPolicy x/web egress rule 0",
	}
	if d := cmp.Diff(want, dump(&got.Egress)); d != "" {
		t.Errorf("egress (-want +got):\n%s", d)
	}
	wantIso := []netpol.RuleRef{
		{Kind: "NetworkPolicy", Policy: got.Pod, Direction: netpol.Egress, Index: -1},
		{Kind: "NetworkPolicy", Policy: got.Pod, Direction: netpol.Egress, Index: -1},
	}
	wantIso[0].Policy.Name, wantIso[1].Policy.Name = "cidr", "web"
	if d := cmp.Diff(wantIso, got.Egress.Isolators); d != "" {
		t.Errorf("egress isolators (-want +got):\n%s", d)
	}
	if !got.Ingress.Isolated || len(got.Ingress.Allowed) != 0 || len(got.Ingress.Isolators) != 1 {
		t.Errorf("ingress: want isolated by x/cidr with nothing allowed, got %+v", got.Ingress)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.0.1.1")}; !slices.Equal(got.IPs, want) {
		t.Errorf("IPs = %v, want %v", got.IPs, want)
	}
	if b := c.Pod(podIndex(ps)["x/b"]); !b.Ingress.Empty() || !b.Egress.Empty() {
		t.Errorf("x/b is selected by no policy, got %+v", b)
	}
	if h := c.Pod(hostNet(mkPod("x/h", []string{"10.0.1.1"}, labelsOf("pod", "a")))); h.IPs != nil || !h.Ingress.Empty() || !h.Egress.Empty() {
		t.Errorf("hostNetwork pod compiled as a subject: %+v", h)
	}
}

// TestDeterministic compiles the same objects in shuffled orders and
// requires identical output (the renderer diffs it); it covers except +
// re-allow by a second policy regardless of which comes first.
func TestDeterministic(t *testing.T) {
	nss, ps := world()
	policies := []*networkingv1.NetworkPolicy{
		mkNP("x/cidr", all, both, in(nil, block("10.0.0.0/16", "10.0.2.0/24")), out(nil, block("10.0.0.0/16", "10.0.2.0/24"))),
		mkNP("x/again", all, both, in(nil, block("10.0.2.2/32")), out(nil, block("10.0.2.0/25"))),
		mkNP("x/pods", sel("pod", "a"), ingressOnly, in(ports(pp("", "serve-80-tcp", 0), pp("", 80, 0)), pods(nil, all), pods(sel("pod", "b"), nil))),
	}
	ref := New(Input{NetworkPolicies: policies, Pods: ps, Namespaces: nss})
	var want []netpol.Pod
	for _, p := range ps {
		want = append(want, ref.Pod(p))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		sh := func(n int, swap func(i, j int)) { rng.Shuffle(n, swap) }
		ps2, pol2, ns2 := slices.Clone(ps), slices.Clone(policies), slices.Clone(nss)
		sh(len(ps2), func(i, j int) { ps2[i], ps2[j] = ps2[j], ps2[i] })
		sh(len(pol2), func(i, j int) { pol2[i], pol2[j] = pol2[j], pol2[i] })
		sh(len(ns2), func(i, j int) { ns2[i], ns2[j] = ns2[j], ns2[i] })
		c := New(Input{NetworkPolicies: pol2, Pods: ps2, Namespaces: ns2})
		for j, p := range ps {
			if d := cmp.Diff(want[j], c.Pod(p), netipEqual...); d != "" {
				t.Fatalf("shuffle %d: %s/%s differs (-first +shuffled):\n%s", i, p.Namespace, p.Name, d)
			}
		}
	}
	// The except + re-allow pain point, checked on the output.
	idx := podIndex(ps)
	for _, f := range []flow{
		{"x/a", "y/b", tcp, 80, true}, {"x/a", "y/c", tcp, 80, true}, {"x/a", "10.0.2.200", tcp, 80, false},
		{"y/b", "x/a", udp, 53, true}, {"y/c", "x/b", tcp, 80, false},
	} {
		if got := allowed(t, ref, idx, f); got != f.want {
			t.Errorf("%s: allowed=%v, want %v", f, got, f.want)
		}
	}
}

var netipEqual = []cmp.Option{
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
}

func TestSubtract(t *testing.T) {
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		from   string
		except []string
		want   string
	}{
		{"10.0.0.0/8", nil, "10.0.0.0/8"},
		{"10.0.0.0/30", []string{"10.0.0.1/32"}, "10.0.0.0/32 10.0.0.2/31"},
		{"10.0.0.0/24", []string{"10.0.0.0/24"}, ""},
		{"10.0.0.0/24", []string{"10.0.0.0/16"}, ""},
		{"10.0.0.0/24", []string{"10.1.0.0/16", "fd00::/8"}, "10.0.0.0/24"},
		{"10.0.0.0/29", []string{"10.0.0.0/31", "10.0.0.4/30"}, "10.0.0.2/31"},
		{"fd00::/126", []string{"fd00::3/128"}, "fd00::/127 fd00::2/128"},
	} {
		ps := []netip.Prefix{p(tc.from)}
		for _, e := range tc.except {
			ps = subtract(ps, p(e))
		}
		slices.SortFunc(ps, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
		var got []string
		for _, x := range ps {
			got = append(got, x.String())
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("%s - %v = %q, want %q", tc.from, tc.except, s, tc.want)
		}
	}
}

// TestErrors: a part that does not parse matches nothing and is reported;
// its policy still isolates.
func TestErrors(t *testing.T) {
	nss, ps := world()
	bad := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: "Near"}}}
	policies := []*networkingv1.NetworkPolicy{
		mkNP("x/p", sel("pod", "a"), ingressOnly, in(nil, block("10.0.0.0/33"), pods(bad, nil))),
	}
	c := New(Input{NetworkPolicies: policies, Pods: ps, Namespaces: nss})
	if errs := c.Errors(); len(errs) != 2 || !strings.Contains(errs[0].Error(), "x/p") {
		t.Errorf("errors = %v, want the CIDR's and the selector's, naming x/p", errs)
	}
	a := c.Pod(podIndex(ps)["x/a"])
	if !a.Ingress.Isolated || len(a.Ingress.Allowed) != 0 {
		t.Errorf("want x/a isolated with nothing allowed, got %+v", a.Ingress)
	}
}
