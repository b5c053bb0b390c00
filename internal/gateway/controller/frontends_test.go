package controller

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func gateway(ns, name string, created int, ports ...int32) *gwv1.Gateway {
	g := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name),
		CreationTimestamp: metav1.NewTime(time.Unix(int64(created), 0))}}
	for i, p := range ports {
		g.Spec.Listeners = append(g.Spec.Listeners, gwv1.Listener{Name: gwv1.SectionName("l" + string(rune('a'+i))), Port: gwv1.PortNumber(p)})
	}
	return g
}

func readyNode(name, ip string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
}

func TestPlanAllocatesUniqueBindsAndKeepsThem(t *testing.T) {
	nodes := []*corev1.Node{readyNode("n2", "10.0.0.2"), readyNode("n1", "10.0.0.1"),
		{ObjectMeta: metav1.ObjectMeta{Name: "down"}}}
	in := planInput{
		Gateways: []*gwv1.Gateway{gateway("b", "gw", 2, 80, 443, 80), gateway("a", "gw", 1, 80)},
		Nodes:    nodes, Range: PortRange{20000, 20010},
	}
	p, errs := plan(in)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if len(p.Services) != 2 {
		t.Fatalf("want 2 Services, got %d", len(p.Services))
	}
	// The oldest Gateway gets the first port.
	a, b := p.Services[0], p.Services[1]
	if a.Namespace != "a" || a.Spec.Ports[0].TargetPort.IntVal != 20000 {
		t.Fatalf("a/gw: %+v", a.Spec.Ports)
	}
	if len(b.Spec.Ports) != 2 || b.Spec.Ports[0].Port != 80 || b.Spec.Ports[0].TargetPort.IntVal != 20001 || b.Spec.Ports[1].TargetPort.IntVal != 20002 {
		t.Fatalf("b/gw ports (one per distinct listener port, sorted): %+v", b.Spec.Ports)
	}
	if b.Name != "gw-flatnet-gw" || b.Labels[LabelGateway] != "gw" || b.OwnerReferences[0].Kind != "Gateway" ||
		b.Spec.Type != corev1.ServiceTypeLoadBalancer || b.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal || b.Spec.Selector != nil {
		t.Fatalf("b/gw Service: %+v", b)
	}
	es := p.Slices[1][0]
	if len(es.Endpoints) != 2 || es.Endpoints[0].Addresses[0] != "10.0.0.1" || *es.Endpoints[0].NodeName != "n1" || *es.Ports[1].Port != 20002 {
		t.Fatalf("slice: ready nodes by name with the bind ports: %+v", es)
	}

	// Recorded binds survive a new, older Gateway and a replan.
	in.Existing = p.Services
	in.Gateways = append(in.Gateways, gateway("c", "gw", 0, 80))
	p2, _ := plan(in)
	got := bindsOf(p2.Services)
	if got[gatewayPort{types.NamespacedName{Namespace: "b", Name: "gw"}, 443}] != 20002 || got[gatewayPort{types.NamespacedName{Namespace: "a", Name: "gw"}, 80}] != 20000 {
		t.Fatalf("binds moved: %v", got)
	}
	if got[gatewayPort{types.NamespacedName{Namespace: "c", Name: "gw"}, 80}] != 20003 {
		t.Fatalf("new Gateway should get the lowest free port: %v", got)
	}

	// A port no listener wants any more is free again at once.
	in.Existing = p2.Services
	in.Gateways = []*gwv1.Gateway{gateway("b", "gw", 2, 443), gateway("d", "gw", 3, 8080)}
	p3, _ := plan(in)
	got = bindsOf(p3.Services)
	if got[gatewayPort{types.NamespacedName{Namespace: "d", Name: "gw"}, 8080}] != 20000 {
		t.Fatalf("freed port not reused: %v", got)
	}
}

func TestPlanFullRangeNamesTheGateway(t *testing.T) {
	p, errs := plan(planInput{
		Gateways: []*gwv1.Gateway{gateway("a", "one", 1, 80), gateway("a", "two", 2, 80, 81)},
		Range:    PortRange{20000, 20001},
	})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "a/two") || !strings.Contains(errs[0].Error(), "--bind-port-range") {
		t.Fatalf("errs %v", errs)
	}
	if len(p.Services) != 2 || len(p.Services[1].Spec.Ports) != 1 {
		t.Fatalf("what fits is still planned: %+v", p.Services)
	}
}

func TestPlanIngressFrontend(t *testing.T) {
	p, _ := plan(planInput{Ingress: true, Namespace: "kube-system", IngressHTTP: 10080, IngressHTTPS: 10443, Range: PortRange{10080, 10081},
		Gateways: []*gwv1.Gateway{gateway("a", "g", 1, 80)}})
	if len(p.Services) != 2 {
		t.Fatalf("%+v", p.Services)
	}
	if p.Services[0].Spec.Ports[0].TargetPort.IntVal != 10081 {
		t.Fatalf("Gateway got an Ingress bind port: %+v", p.Services[0].Spec.Ports)
	}
	ing := p.Services[1]
	if ing.Name != IngressService || ing.Namespace != "kube-system" || ing.Spec.Ports[1].Port != 443 || ing.Spec.Ports[1].TargetPort.IntVal != 10443 {
		t.Fatalf("%+v", ing)
	}
}

func TestFrontendNameFitsAServiceName(t *testing.T) {
	long := strings.Repeat("g", 63)
	n := frontendName(long)
	if len(n) > 63 || n == frontendName(long+"x") {
		t.Fatalf("%q", n)
	}
	if frontendName("web") != "web-flatnet-gw" {
		t.Fatal(frontendName("web"))
	}
}

func TestParsePortRange(t *testing.T) {
	if r, err := ParsePortRange("20000-29999"); err != nil || r.First != 20000 || r.Last != 29999 {
		t.Fatal(r, err)
	}
	for _, bad := range []string{"", "20000", "3-2", "0-10", "1-70000", "a-b"} {
		if _, err := ParsePortRange(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The Node cache keeps a Node's name, InternalIPs and Ready condition:
// what nodeAddresses reads, so planning from trimmed Nodes gives the same
// frontends.
func TestSlimNode(t *testing.T) {
	n := readyNode("n1", "10.0.0.1")
	n.Labels = map[string]string{"a": "b"}
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: "n1"})
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Message: "ok"})
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"pause"}}}
	got, err := slim(n)
	if err != nil {
		t.Fatal(err)
	}
	s := got.(*corev1.Node)
	want := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
	if !equality.Semantic.DeepEqual(s, want) {
		t.Fatalf("slim(node) = %+v, want %+v", s, want)
	}
	if !slices.Equal(nodeAddresses([]*corev1.Node{s}), nodeAddresses([]*corev1.Node{n})) {
		t.Fatal("the trimmed Node plans other frontends")
	}
}
