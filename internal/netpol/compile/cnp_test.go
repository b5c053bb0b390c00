package compile

import (
	"bytes"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	conformance "sigs.k8s.io/network-policy-api/conformance"
	"sigs.k8s.io/yaml"

	"github.com/flatnet/flatnet/internal/netpol"
)

const housePrefix = "network-policy-conformance-"

// suiteWorld is the cluster a conformance test runs in.
type suiteWorld struct {
	nss  []*corev1.Namespace
	pods []*corev1.Pod
	cnps []*cnpv1.ClusterNetworkPolicy
	nps  []*networkingv1.NetworkPolicy
}

func (w *suiteWorld) input() Input {
	return Input{NetworkPolicies: w.nps, Pods: w.pods, Namespaces: w.nss, ClusterNetworkPolicies: w.cnps}
}

// loadSuite reads the suite's base manifests and a test's manifest as
// the apiserver and controllers would leave them: namespaces get
// kubernetes.io/metadata.name, each StatefulSet replica becomes a running
// pod with the StatefulSet labels and an address.
func loadSuite(t *testing.T, manifest string) *suiteWorld {
	t.Helper()
	w := &suiteWorld{}
	for _, name := range []string{"base/manifests.yaml", manifest} {
		raw, err := fs.ReadFile(conformance.Manifests, name)
		if err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		var text bytes.Buffer
		tmpl := template.Must(template.New(name).Parse(string(raw)))
		if err := tmpl.Execute(&text, map[string][]int{"HostNetworkPorts": {34345, 34346, 34347, 34348, 34349, 34350, 34351, 34352}}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(text.String(), -1) {
			w.add(t, name, []byte(doc))
		}
	}
	return w
}

func (w *suiteWorld) add(t *testing.T, file string, doc []byte) {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	decode := func(into any) {
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			t.Fatalf("%s: %s: %v", file, meta.Kind, err)
		}
	}
	switch meta.Kind {
	case "":
	case "Namespace":
		ns := &corev1.Namespace{}
		decode(ns)
		ns.Labels["kubernetes.io/metadata.name"] = ns.Name
		w.nss = append(w.nss, ns)
	case "StatefulSet":
		sts := &appsv1.StatefulSet{}
		decode(sts)
		for i := range int(*sts.Spec.Replicas) {
			p := &corev1.Pod{ObjectMeta: *sts.Spec.Template.ObjectMeta.DeepCopy(), Spec: *sts.Spec.Template.Spec.DeepCopy()}
			p.Namespace, p.Name = sts.Namespace, fmt.Sprintf("%s-%d", sts.Name, i)
			p.Labels["statefulset.kubernetes.io/pod-name"] = p.Name
			p.Labels["apps.kubernetes.io/pod-index"] = strconv.Itoa(i)
			ip := fmt.Sprintf("10.244.%d.%d", len(w.nss), 10+len(w.pods))
			if p.Spec.HostNetwork {
				ip = fmt.Sprintf("192.168.50.%d", 1+i)
			}
			p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
			w.pods = append(w.pods, p)
		}
	case "ClusterNetworkPolicy":
		p := &cnpv1.ClusterNetworkPolicy{}
		decode(p)
		w.cnps = append(w.cnps, p)
	case "NetworkPolicy":
		p := &networkingv1.NetworkPolicy{}
		decode(p)
		w.nps = append(w.nps, p)
	default:
		t.Fatalf("%s: unexpected kind %s", file, meta.Kind)
	}
}

func (w *suiteWorld) pod(t *testing.T, housePod string) *corev1.Pod {
	for _, p := range w.pods {
		if p.Namespace+"/"+p.Name == housePrefix+housePod {
			return p
		}
	}
	t.Fatalf("no pod %s", housePod)
	return nil
}

func (w *suiteWorld) cnp(t *testing.T, name string) *cnpv1.ClusterNetworkPolicy {
	for _, p := range w.cnps {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no ClusterNetworkPolicy %s", name)
	return nil
}

// apply runs one mutation of the table; it reports false for a line that
// is not one.
func (w *suiteWorld) apply(t *testing.T, op string) bool {
	f := strings.Fields(op)
	atoi := func(s string) int {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("%q: %v", op, err)
		}
		return n
	}
	switch f[0] {
	case "swap": // swap POLICY ingress|egress I J
		p, i, j := w.cnp(t, f[1]), atoi(f[3]), atoi(f[4])
		if f[2] == "ingress" {
			p.Spec.Ingress[i], p.Spec.Ingress[j] = p.Spec.Ingress[j], p.Spec.Ingress[i]
		} else {
			p.Spec.Egress[i], p.Spec.Egress[j] = p.Spec.Egress[j], p.Spec.Egress[i]
		}
	case "action": // action POLICY ingress|egress I ACTION
		p, i, a := w.cnp(t, f[1]), atoi(f[3]), cnpv1.ClusterNetworkPolicyRuleAction(f[4])
		if f[2] == "ingress" {
			p.Spec.Ingress[i].Action = a
		} else {
			p.Spec.Egress[i].Action = a
		}
	case "named-port": // named-port POLICY ingress|egress I NAME: the rule's protocols become that named port
		p, i := w.cnp(t, f[1]), atoi(f[3])
		protos := []cnpv1.ClusterNetworkPolicyProtocol{{DestinationNamedPort: f[4]}}
		if f[2] == "ingress" {
			p.Spec.Ingress[i].Protocols = protos
		} else {
			p.Spec.Egress[i].Protocols = protos
		}
	case "priority": // priority POLICY N
		w.cnp(t, f[1]).Spec.Priority = int32(atoi(f[2]))
	case "label", "unlabel": // label HOUSE/POD k=v; unlabel HOUSE/POD k
		p := w.pod(t, f[1])
		k, v, _ := strings.Cut(f[2], "=")
		if f[0] == "label" {
			p.Labels[k] = v
		} else {
			delete(p.Labels, k)
		}
	case "nslabels": // nslabels HOUSE k=v: replaces the labels (the apiserver keeps metadata.name)
		for _, ns := range w.nss {
			if ns.Name == housePrefix+f[1] {
				k, v, _ := strings.Cut(f[2], "=")
				ns.Labels = map[string]string{k: v, "kubernetes.io/metadata.name": ns.Name}
			}
		}
	case "delete-np": // delete-np HOUSE/NAME
		w.nps = deleteFunc(w.nps, func(np *networkingv1.NetworkPolicy) bool { return np.Namespace+"/"+np.Name == housePrefix+f[1] })
	case "prepend-networks": // prepend-networks POLICY HOUSE/POD...: an Accept rule to their addresses
		r := cnpv1.ClusterNetworkPolicyEgressRule{Name: "allow-egress-to-specific-podIPs", Action: cnpv1.ClusterNetworkPolicyRuleActionAccept}
		var nets []cnpv1.CIDR
		for _, hp := range f[2:] {
			nets = append(nets, cnpv1.CIDR(w.pod(t, hp).Status.PodIP+"/32"))
		}
		r.To = []cnpv1.ClusterNetworkPolicyEgressPeer{{Networks: nets}}
		p := w.cnp(t, f[1])
		p.Spec.Egress = append([]cnpv1.ClusterNetworkPolicyEgressRule{r}, p.Spec.Egress...)
	default:
		return false
	}
	return true
}

func deleteFunc[T any](s []T, del func(T) bool) []T {
	var out []T
	for _, x := range s {
		if !del(x) {
			out = append(out, x)
		}
	}
	return out
}

var probeRE = regexp.MustCompile(`^(\S+) -> (\S+) (tcp|udp|sctp)/(\d+) (allow|deny)$`)

func TestClusterConformance(t *testing.T) {
	probes := 0
	for _, tc := range conformanceCases {
		t.Run(tc.name, func(t *testing.T) {
			w := loadSuite(t, tc.manifest)
			var c *Compiler
			subtest := ""
			for _, op := range tc.ops {
				if s, ok := strings.CutPrefix(op, "# "); ok {
					subtest = s
					continue
				}
				if w.apply(t, op) {
					c = nil // recompile
					continue
				}
				m := probeRE.FindStringSubmatch(op)
				if m == nil {
					t.Fatalf("bad table line %q", op)
				}
				if c == nil {
					c = New(w.input())
					if errs := c.Errors(); len(errs) > 0 {
						t.Fatalf("errors: %v", errs)
					}
				}
				client, server := w.pod(t, m[1]), w.pod(t, m[2])
				proto := map[string]netpol.Protocol{"tcp": netpol.ProtoTCP, "udp": netpol.ProtoUDP, "sctp": netpol.ProtoSCTP}[m[3]]
				port, _ := strconv.Atoi(m[4])
				ok, why := clusterVerdict(c, client, server, proto, uint16(port))
				probes++
				if ok != (m[5] == "allow") {
					t.Errorf("%s: %s: got allowed=%v (%s)", subtest, op, ok, why)
				}
			}
		})
	}
	t.Logf("%d probes of %d tests", probes, len(conformanceCases))
}

func clusterVerdict(c *Compiler, client, server *corev1.Pod, proto netpol.Protocol, port uint16) (bool, string) {
	cp, sp := c.Pod(client), c.Pod(server)
	eg := cp.Egress.Check(sp.IPs[0], proto, port)
	in := sp.Ingress.Check(cp.IPs[0], proto, port)
	return eg.Allowed && in.Allowed, "egress " + eg.String() + "; ingress " + in.String()
}

func mkCNP(name string, tier cnpv1.Tier, priority int32, subject *metav1.LabelSelector) *cnpv1.ClusterNetworkPolicy {
	return &cnpv1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       cnpv1.ClusterNetworkPolicySpec{Tier: tier, Priority: priority, Subject: cnpv1.ClusterNetworkPolicySubject{Namespaces: subject}},
	}
}

func cnpIn(action cnpv1.ClusterNetworkPolicyRuleAction, protos []cnpv1.ClusterNetworkPolicyProtocol, from ...cnpv1.ClusterNetworkPolicyIngressPeer) cnpv1.ClusterNetworkPolicyIngressRule {
	return cnpv1.ClusterNetworkPolicyIngressRule{Action: action, Protocols: protos, From: from}
}

func cnpOut(action cnpv1.ClusterNetworkPolicyRuleAction, protos []cnpv1.ClusterNetworkPolicyProtocol, to ...cnpv1.ClusterNetworkPolicyEgressPeer) cnpv1.ClusterNetworkPolicyEgressRule {
	return cnpv1.ClusterNetworkPolicyEgressRule{Action: action, Protocols: protos, To: to}
}

const (
	accept = cnpv1.ClusterNetworkPolicyRuleActionAccept
	deny   = cnpv1.ClusterNetworkPolicyRuleActionDeny
	pass   = cnpv1.ClusterNetworkPolicyRuleActionPass
)

// TestClusterRules: tier order (priority, name, index), Pass in either
// tier, fail closed, named ports taking the container port's protocol,
// and hostNetwork pods neither subjects nor peers.
func TestClusterRules(t *testing.T) {
	nss, ps := world()
	host := hostNet(mkPod("y/host", []string{"192.168.50.1"}, labelsOf("pod", "a")))
	ps = append(ps, host)
	fromNS := func(ns string) cnpv1.ClusterNetworkPolicyIngressPeer {
		return cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: sel("ns", ns)}
	}
	tcpPort := func(n int32) cnpv1.ClusterNetworkPolicyProtocol {
		return cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1.Port{Number: n}}}
	}
	b := mkCNP("b", cnpv1.AdminTier, 10, sel("ns", "x"))
	b.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{
		cnpIn(pass, []cnpv1.ClusterNetworkPolicyProtocol{tcpPort(80)}, fromNS("y")),
		cnpIn(deny, nil, fromNS("y")),
	}
	a := mkCNP("a", cnpv1.AdminTier, 10, sel("ns", "x")) // same priority: a before b
	a.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{cnpIn(accept, []cnpv1.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "serve-80-udp"}}, fromNS("y"))}
	first := mkCNP("z-first", cnpv1.AdminTier, 1, sel("ns", "x"))
	first.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{cnpIn(deny, []cnpv1.ClusterNetworkPolicyProtocol{tcpPort(81)}, fromNS("z"))}
	base := mkCNP("base", cnpv1.BaselineTier, 5, sel("ns", "x"))
	base.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{
		cnpIn(pass, []cnpv1.ClusterNetworkPolicyProtocol{tcpPort(80)}, fromNS("z")),
		cnpIn(deny, nil, fromNS("z")),
	}
	nodes := mkCNP("nodes", cnpv1.AdminTier, 20, nil) // subject: pod a in z only
	nodes.Spec.Subject = cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *sel("ns", "z"), PodSelector: *sel("pod", "a")}}
	nodes.Spec.Egress = []cnpv1.ClusterNetworkPolicyEgressRule{
		cnpOut(accept, nil, cnpv1.ClusterNetworkPolicyEgressPeer{Nodes: &metav1.LabelSelector{}}),
		cnpOut(deny, []cnpv1.ClusterNetworkPolicyProtocol{tcpPort(443)}, cnpv1.ClusterNetworkPolicyEgressPeer{DomainNames: []cnpv1.DomainName{"example.com"}}),
	}
	everyone := mkCNP("everyone", cnpv1.AdminTier, 30, &metav1.LabelSelector{})
	everyone.Spec.Egress = []cnpv1.ClusterNetworkPolicyEgressRule{cnpOut(deny, []cnpv1.ClusterNetworkPolicyProtocol{tcpPort(9)}, cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: &metav1.LabelSelector{}})}
	np := mkNP("x/only-z-c", all, ingressOnly, in(nil, pods(sel("pod", "c"), sel("ns", "z"))))

	c := New(Input{Pods: ps, Namespaces: nss, NetworkPolicies: []*networkingv1.NetworkPolicy{np},
		ClusterNetworkPolicies: []*cnpv1.ClusterNetworkPolicy{everyone, nodes, base, b, a, first}})
	if errs := c.Errors(); len(errs) != 2 || !strings.Contains(errs[0].Error(), "nodes") {
		t.Errorf("errors = %v, want the nodes and domainNames peers reported", errs)
	}
	x := c.Pod(podIndex(ps)["x/a"])
	var order []string
	for _, r := range x.Ingress.Admin {
		order = append(order, fmt.Sprintf("%s/%d %s p%d", r.Rule.Policy.Name, r.Rule.Index, r.Action, r.Priority))
	}
	if want := []string{"z-first/0 Deny p1", "a/0 Accept p10", "b/0 Pass p10", "b/1 Deny p10"}; !slices.Equal(order, want) {
		t.Errorf("admin ingress order = %v, want %v", order, want)
	}
	idx := podIndex(ps)
	for _, f := range []flow{
		{"y/b", "x/a", udp, 80, true},   // a: named port with the container's protocol (UDP)
		{"y/b", "x/a", tcp, 80, false},  // b: Pass, then the NetworkPolicy isolates x/a
		{"z/c", "x/a", tcp, 80, true},   // no admin match; the NetworkPolicy allows z/c
		{"z/c", "x/a", tcp, 81, false},  // z-first denies before anything
		{"y/b", "x/a", udp, 53, false},  // b/1 denies
		{"z/b", "x/b", tcp, 80, false},  // NetworkPolicy: x/b isolated, z/b not allowed
		{"y/a", "y/b", tcp, 9, false},   // everyone: egress deny
		{"y/host", "y/b", tcp, 9, true}, // hostNetwork pod: not a subject
		{"y/a", "y/host", tcp, 9, true}, // nor a peer
	} {
		if got := allowed(t, c, idx, f); got != f.want {
			t.Errorf("%s: allowed=%v, want %v", f, got, f.want)
		}
	}

	// Baseline: x has no NetworkPolicy isolating ingress here.
	c = New(Input{Pods: ps, Namespaces: nss, ClusterNetworkPolicies: []*cnpv1.ClusterNetworkPolicy{base, nodes}})
	for _, f := range []flow{
		{"z/b", "x/a", tcp, 80, true},  // baseline Pass: the rest of the tier is skipped, then allow
		{"z/b", "x/a", tcp, 81, false}, // baseline Deny
		{"y/b", "x/a", tcp, 81, true},  // nothing matches
		// nodes: Accept with an unknown peer matches nothing; Deny with
		// one fails closed to "Deny all" (every peer, protocol, port).
		{"z/a", "y/a", udp, 53, false},
		{"z/a", "198.51.100.1", tcp, 80, false},
	} {
		if got := allowed(t, c, idx, f); got != f.want {
			t.Errorf("baseline: %s: allowed=%v, want %v", f, got, f.want)
		}
	}
	z := c.Pod(idx["z/a"])
	if len(z.Egress.Admin) != 1 || z.Egress.Admin[0].Action != netpol.Deny || z.Egress.Admin[0].Rule.Index != 1 {
		t.Errorf("z/a egress admin = %+v, want only rule 1 as Deny all", z.Egress.Admin)
	}
}
