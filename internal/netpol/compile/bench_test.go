package compile

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// benchInput is issue 12's scale: 100 namespaces of 5 pods (web, api,
// db, cache, worker) and 10 policies each: default deny, per-app allows
// by app label, a few namespaceSelectors (monitoring, a frontend team),
// named and numbered ports, DNS egress, an ipBlock with except.
func benchInput() Input {
	var input Input
	apps := []string{"web", "api", "db", "cache", "worker"}
	for n := range 100 {
		ns := fmt.Sprintf("ns-%03d", n)
		team := []string{"frontend", "backend", "data"}[n%3]
		input.Namespaces = append(input.Namespaces, mkNS(ns, "team", team))
		for i, app := range apps {
			input.Pods = append(input.Pods, mkPod(ns+"/"+app, []string{fmt.Sprintf("10.%d.%d.%d", 1+n/250, n%250, 10+i)},
				labelsOf("app", app, "team", team),
				cport("http", 8080+int32(i), corev1.ProtocolTCP), cport("metrics", 9090, corev1.ProtocolTCP)))
		}
		app := func(a string) *metav1.LabelSelector { return sel("app", a) }
		input.NetworkPolicies = append(input.NetworkPolicies,
			mkNP(ns+"/default-deny", all, both),
			mkNP(ns+"/web-from-frontend", app("web"), ingressOnly,
				in(ports(pp("", 80, 0), pp("", 443, 0), pp("", "http", 0)), pods(nil, sel("team", "frontend")), block("0.0.0.0/0", "10.0.0.0/8"))),
			mkNP(ns+"/api-from-web", app("api"), ingressOnly, in(ports(pp("", "http", 0)), pods(app("web"), nil))),
			mkNP(ns+"/db-from-api", app("db"), ingressOnly, in(ports(pp("", 5432, 0)), pods(app("api"), nil), pods(app("worker"), nil))),
			mkNP(ns+"/cache-from-apps", app("cache"), ingressOnly, in(ports(pp("", 6379, 0)), pods(expr("app", metav1.LabelSelectorOpIn, "api", "worker"), nil))),
			mkNP(ns+"/metrics", all, ingressOnly, in(ports(pp("", "metrics", 0)), pods(sel("app", "prometheus"), sel("kubernetes.io/metadata.name", "monitoring")))),
			mkNP(ns+"/dns", all, egressOnly, out(ports(pp(corev1.ProtocolUDP, 53, 0), pp(corev1.ProtocolTCP, 53, 0)),
				pods(sel("k8s-app", "kube-dns"), sel("kubernetes.io/metadata.name", "kube-system")))),
			mkNP(ns+"/web-to-api", app("web"), egressOnly, out(ports(pp("", "http", 0)), pods(app("api"), nil))),
			mkNP(ns+"/api-to-backends", app("api"), egressOnly, out(ports(pp("", 5432, 0), pp("", 6379, 0)), pods(expr("app", metav1.LabelSelectorOpIn, "db", "cache"), nil))),
			mkNP(ns+"/worker-out", app("worker"), egressOnly, out(ports(pp("", 443, 0), pp("", 30000, 32767)), block("0.0.0.0/0", "10.0.0.0/8", "192.168.0.0/16"))),
		)
	}
	return input
}

// BenchmarkCompile is one full recompile: New, then Pod for every pod
// (new+pods); new alone is the indexing part.
func BenchmarkCompile(b *testing.B) {
	in := benchInput()
	b.Run("new", func(b *testing.B) {
		for b.Loop() {
			New(in)
		}
	})
	b.Run("new+pods", func(b *testing.B) { benchPods(b, in) })
	in.ClusterNetworkPolicies = benchClusterPolicies()
	b.Run("new+pods+20cnp", func(b *testing.B) { benchPods(b, in) })
}

func benchPods(b *testing.B, in Input) {
	{
		entries := 0
		for b.Loop() {
			c := New(in)
			entries = 0
			for _, p := range in.Pods {
				r := c.Pod(p)
				entries += len(r.Ingress.Allowed) + len(r.Egress.Allowed)
			}
		}
		b.ReportMetric(float64(entries), "entries")
		b.Logf("%d pods, %d policies, %d cluster policies, %d namespaces: %d allowed entries",
			len(in.Pods), len(in.NetworkPolicies), len(in.ClusterNetworkPolicies), len(in.Namespaces), entries)
	}
}

// benchClusterPolicies: 20 ClusterNetworkPolicies in both tiers, each a
// few rules over namespace selectors, networks and ports.
func benchClusterPolicies() []*cnpv1.ClusterNetworkPolicy {
	var out []*cnpv1.ClusterNetworkPolicy
	tcp := func(n int32) []cnpv1.ClusterNetworkPolicyProtocol {
		return []cnpv1.ClusterNetworkPolicyProtocol{{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1.Port{Number: n}}}}
	}
	for i := range 10 {
		team := []string{"frontend", "backend", "data"}[i%3]
		a := mkCNP(fmt.Sprintf("admin-%02d", i), cnpv1.AdminTier, int32(i), sel("team", team))
		a.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{
			cnpIn(accept, nil, cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: sel("kubernetes.io/metadata.name", "monitoring")}),
			cnpIn(deny, tcp(5432+int32(i)), cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: sel("team", "frontend")}),
		}
		a.Spec.Egress = []cnpv1.ClusterNetworkPolicyEgressRule{
			cnpOut(pass, tcp(53), cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: sel("kubernetes.io/metadata.name", "kube-system")}),
			cnpOut(deny, nil, cnpv1.ClusterNetworkPolicyEgressPeer{Networks: []cnpv1.CIDR{"169.254.169.254/32"}}),
		}
		bl := mkCNP(fmt.Sprintf("baseline-%02d", i), cnpv1.BaselineTier, int32(i), &metav1.LabelSelector{})
		bl.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{
			cnpIn(deny, nil, cnpv1.ClusterNetworkPolicyIngressPeer{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *sel("team", team), PodSelector: *sel("app", "worker")}}),
		}
		out = append(out, a, bl)
	}
	return out
}

// TestBenchInputCompiles keeps the benchmark's input honest: web gets
// the frontend namespaces' pods, and the policies parse.
func TestBenchInputCompiles(t *testing.T) {
	in := benchInput()
	c := New(in)
	if errs := c.Errors(); len(errs) > 0 {
		t.Fatal(errs)
	}
	web := c.Pod(in.Pods[0])
	if !web.Ingress.Isolated || !web.Egress.Isolated || len(web.Ingress.Allowed) < 34*5 {
		t.Errorf("ns-000/web: want isolated both ways with the frontend pods allowed, got %d ingress entries", len(web.Ingress.Allowed))
	}
}

// TestConcurrentPods: Pod is safe to call from several goroutines (peer
// selectors resolve once, scratch is pooled); run with -race.
func TestConcurrentPods(t *testing.T) {
	in := benchInput()
	in.ClusterNetworkPolicies = benchClusterPolicies()
	c := New(in)
	want := make([]int, len(in.Pods))
	done := make(chan []int)
	for range 4 {
		go func() {
			got := make([]int, len(in.Pods))
			for i, p := range in.Pods {
				r := c.Pod(p)
				got[i] = len(r.Ingress.Allowed) + len(r.Egress.Allowed) + len(r.Ingress.Admin) + len(r.Egress.Baseline)
			}
			done <- got
		}()
	}
	for g := range 4 {
		got := <-done
		if g == 0 {
			want = got
		} else if !slices.Equal(got, want) {
			t.Fatal("concurrent Pod calls disagree")
		}
	}
}
