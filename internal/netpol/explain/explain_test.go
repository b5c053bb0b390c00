package explain

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
)

func pod(ns, name, ip string, lbl map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: ports}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

func ns(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/metadata.name": name}}}
}

// TestExplainNamesTheRule: y/b admits x/a on its named port "web" only;
// explain names the allowing rule, the isolating policy for a denied
// port, and says when no policy applies.
func TestExplainNamesTheRule(t *testing.T) {
	web := intstr.FromString("web")
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "y", Name: "allow-a-web"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "x"}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &web}},
			}},
		},
	}
	client := fake.NewClientset(ns("x"), ns("y"), np,
		pod("x", "a", "10.244.1.2", map[string]string{"pod": "a"}),
		pod("y", "b", "10.244.2.3", map[string]string{"pod": "b"}, corev1.ContainerPort{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}))
	ctx := context.Background()
	for _, tc := range []struct {
		from, to string
		allowed  bool
		want     []string
	}{
		{"x/a", "y/b:web", true, []string{"tcp/8080", "NetworkPolicy y/allow-a-web ingress rule 0", "ALLOWED"}},
		{"x/a", "y/b:8080/TCP", true, []string{"ALLOWED"}},
		{"x/a", "y/b:8080/UDP", false, []string{"isolated by NetworkPolicy y/allow-a-web", "DENIED"}},
		{"10.9.9.9", "y/b:web", false, []string{"10.9.9.9 is not a pod", "DENIED"}},
		{"y/b", "x/a:80", true, []string{"no policy selects the pod"}},
	} {
		res, err := run(ctx, client, tc.from, tc.to)
		if err != nil {
			t.Errorf("%s -> %s: %v", tc.from, tc.to, err)
			continue
		}
		out := res.String()
		if res.Allowed() != tc.allowed {
			t.Errorf("%s -> %s: allowed=%v, want %v\n%s", tc.from, tc.to, res.Allowed(), tc.allowed, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s -> %s: output lacks %q:\n%s", tc.from, tc.to, w, out)
			}
		}
	}
	for _, tc := range []struct{ from, to, want string }{
		{"x/zz", "y/b:80", "no pod x/zz"},
		{"x/a", "y/b", "want NAMESPACE/POD:PORT"},
		{"x/a", "y/b:nope", `no tcp container port named "nope"`},
		{"x/a", "y/b:80/ICMP", "want TCP, UDP or SCTP"},
		{"x/a", "10.0.0.1:web", "needs a destination pod"},
	} {
		if _, err := run(ctx, client, tc.from, tc.to); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s -> %s: error %v, want one containing %q", tc.from, tc.to, err, tc.want)
		}
	}
}
