package agent

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netpol/nftables"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/proxy/runner"
)

func policyPod(name, node, ip string, lbl map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name, Labels: lbl,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

// TestPolicyController: a default-deny policy puts the node's selected pod
// (and no other pod) in the isolated set; deleting it takes it out.
func TestPolicyController(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := policyClient()
	f := nft.NewFake(knftables.InetFamily, nftables.DefaultTable)
	c := &policyController{node: "n1", client: client, renderer: nftables.NewRenderer(), syncer: nftables.NewSyncer(f)}
	c.runner = runner.New(c.syncAndLog, runner.Config{MinInterval: 0, MaxInterval: time.Hour})
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	isolated := func() []string {
		f.RLock()
		defer f.RUnlock()
		if f.Table == nil || f.Table.Sets["ingress-isolated-v4"] == nil {
			return nil
		}
		var out []string
		for _, e := range f.Table.Sets["ingress-isolated-v4"].Elements {
			out = append(out, e.Key[0])
		}
		return out
	}
	waitFor := func(what string, ok func([]string) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok(isolated()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: isolated set is %v", what, isolated())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("before any policy", func(s []string) bool { return f.Runs() > 0 && len(s) == 0 })
	if _, err := client.NetworkingV1().NetworkPolicies("x").Create(ctx, denyIngressA(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("after default deny", func(s []string) bool { return len(s) == 1 && s[0] == "10.244.1.5" })
	if err := client.NetworkingV1().NetworkPolicies("x").Delete(ctx, "deny", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("after delete", func(s []string) bool { return len(s) == 0 })
	if p, err := c.pods.Pods("x").Get("a"); err != nil || p.ManagedFields != nil {
		t.Errorf("cached pod: %v, managedFields %v (want stripped)", err, p.ManagedFields)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// policyClient serves namespace x with pods a (app=a) and b on node n1,
// c (app=a) on n2.
func policyClient() *fake.Clientset {
	return fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"kubernetes.io/metadata.name": "x"}}},
		policyPod("a", "n1", "10.244.1.5", map[string]string{"app": "a"}),
		policyPod("b", "n1", "10.244.1.6", map[string]string{"app": "b"}),
		policyPod("c", "n2", "10.244.2.5", map[string]string{"app": "a"}),
	)
}

// denyIngressA isolates x's app=a pods for ingress, allowing nothing.
func denyIngressA() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}
}

func TestPodChanged(t *testing.T) {
	a := policyPod("a", "n1", "10.244.1.5", map[string]string{"app": "a"})
	b := a.DeepCopy()
	b.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if podChanged(a, b) {
		t.Error("a condition change triggered a sync")
	}
	b.Labels = map[string]string{"app": "b"}
	if !podChanged(a, b) {
		t.Error("a label change did not trigger a sync")
	}
}

// trimPod keeps every field the policy reads: the change filter sees no
// difference, named ports of containers and sidecars stay, the rest goes.
func TestTrimPod(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "a", UID: "u1", ResourceVersion: "7", Labels: map[string]string{"app": "web"},
			Annotations: map[string]string{"big": strings.Repeat("x", 1000)}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.PodSpec{NodeName: "n1", HostNetwork: false,
			Containers: []corev1.Container{{Name: "app", Image: "img", Env: []corev1.EnvVar{{Name: "A", Value: "b"}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}, {Name: "noports", Image: "img2"}},
			InitContainers: []corev1.Container{{Name: "side", RestartPolicy: &always, Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}}},
				{Name: "once", Ports: []corev1.ContainerPort{{Name: "x", ContainerPort: 1}}}},
			Volumes: []corev1.Volume{{Name: "v"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.5", PodIPs: []corev1.PodIP{{IP: "10.0.0.5"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	got, err := policyTransform(p.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	tp := got.(*corev1.Pod)
	if podChanged(p, tp) || localPod(p, "n1") != localPod(tp, "n1") || tp.UID != p.UID || tp.ResourceVersion != p.ResourceVersion {
		t.Errorf("the trimmed pod differs in what the policy reads: %+v", tp)
	}
	if len(tp.Spec.Containers) != 1 || tp.Spec.Containers[0].Ports[0].Name != "http" || tp.Spec.Containers[0].Image != "" {
		t.Errorf("containers: %+v", tp.Spec.Containers)
	}
	if len(tp.Spec.InitContainers) != 1 || tp.Spec.InitContainers[0].Name != "side" || *tp.Spec.InitContainers[0].RestartPolicy != always {
		t.Errorf("init containers: %+v", tp.Spec.InitContainers)
	}
	if tp.Annotations != nil || tp.ManagedFields != nil || tp.Spec.Volumes != nil || tp.Status.Conditions != nil {
		t.Errorf("kept what the policy never reads: %+v", tp)
	}
}

// With no policy of either kind, a sync compiles this node's pods only;
// with one, every pod of the cluster (any may be a peer).
func TestPodsToCompile(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{byNode: podNode})
	for _, p := range []*corev1.Pod{policyPod("a", "n1", "10.0.0.2", nil), policyPod("b", "n2", "10.0.1.2", nil), policyPod("c", "n1", "10.0.0.3", nil)} {
		if err := idx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	c := &policyController{node: "n1", pods: corelisters.NewPodLister(idx), podsByNode: idx}
	names := func(noPolicy bool) []string {
		pods, err := c.podsToCompile(noPolicy)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range pods {
			out = append(out, p.Name)
		}
		slices.Sort(out)
		return out
	}
	if got := names(true); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("no policy: %v, want this node's a c", got)
	}
	if got := names(false); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("with policies: %v, want every pod", got)
	}
}
