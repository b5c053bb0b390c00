package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/flatnet/flatnet/internal/gateway/table"
	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/lab/controlplane/cptest"
)

// fakeDataPlane records the tables the controller hands over.
type fakeDataPlane struct {
	mu sync.Mutex
	t  *table.Table
	n  int
}

func (f *fakeDataPlane) Update(t *table.Table) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t, f.n = t, f.n+1
	return nil
}

func (f *fakeDataPlane) current() (*table.Table, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t, f.n
}

// TestControllerOnAPIServer runs the controller against a real
// kube-apiserver with the lab's Gateway API CRDs: a Gateway gets its
// frontend Service and EndpointSlice, becomes Programmed with the
// Service's load-balancer IP, its route is Accepted, the data plane gets a
// port on the bind port serving the route's endpoints, and a second sync
// with nothing changed writes nothing.
// createReadyNode makes a Node with InternalIP ip and a Ready status.
func createReadyNode(ctx context.Context, t *testing.T, kc kubernetes.Interface, name, ip string) {
	t.Helper()
	node := readyNode(name, ip)
	n, err := kc.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status = node.Status
	if _, err := kc.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestControllerOnAPIServer(t *testing.T) {
	kubeconfig, _ := cptest.Start(t, 2*time.Minute)
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), klog.Background()), 3*time.Minute)
	defer cancel()
	if err := lab.EnsureCRDs(ctx, kubeconfig); err != nil {
		t.Fatal(err)
	}
	cfg, err := kube.Config(kubeconfig, "gateway-test")
	if err != nil {
		t.Fatal(err)
	}
	kc := kubernetes.NewForConfigOrDie(cfg)
	gc := gwclient.NewForConfigOrDie(jsonConfig(cfg))

	// A Ready node, a backend Service with one endpoint, a Gateway, a route.
	createReadyNode(ctx, t, kc, "n1", "10.0.0.1")
	ns := "default"
	if _, err := kc.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 8080, Protocol: corev1.ProtocolTCP}}, Selector: map[string]string{"app": "web"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	port := int32(8080)
	if _, err := kc.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: ptr.To(corev1.ProtocolTCP), Name: ptr.To("")}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := gc.GatewayV1().Gateways(ns).Create(ctx, &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "gw"},
		Spec:       gwv1.GatewaySpec{GatewayClassName: "flatnet", Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := gc.GatewayV1().HTTPRoutes(ns).Create(ctx, &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "r"},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "gw"}}},
			Rules: []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{
				Name: "web", Port: ptr.To(gwv1.PortNumber(8080))}}}}}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dp := &fakeDataPlane{}
	c := New(kc, gc, dp, Options{NodeName: "n1", Namespace: "kube-system", Range: PortRange{21000, 21099}, Ingress: true, IngressHTTP: 10080, IngressHTTPS: 10443}, klog.Background())
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	poll := func(what string, f func() (bool, error)) {
		t.Helper()
		var last error
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			ok, err := f()
			last = err
			return ok, nil
		})
		if err != nil {
			t.Fatalf("%s: %v (last: %v)", what, err, last)
		}
	}
	var svc *corev1.Service
	poll("frontend Service", func() (bool, error) {
		svc, err = kc.CoreV1().Services(ns).Get(ctx, "gw-flatnet-gw", metav1.GetOptions{})
		return err == nil, err
	})
	if svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.IntVal != 21000 || svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		t.Fatalf("frontend Service: %+v", svc.Spec)
	}
	poll("frontend EndpointSlice", func() (bool, error) {
		es, err := kc.DiscoveryV1().EndpointSlices(ns).Get(ctx, "gw-flatnet-gw", metav1.GetOptions{})
		return err == nil && len(es.Endpoints) == 1 && es.Endpoints[0].Addresses[0] == "10.0.0.1" && *es.Ports[0].Port == 21000, err
	})
	// What a load-balancer IP allocator does.
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.251.0.7"}}
	if _, err := kc.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("Gateway Programmed with the address", func() (bool, error) {
		g, err := gc.GatewayV1().Gateways(ns).Get(ctx, "gw", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ok := meta.IsStatusConditionTrue(g.Status.Conditions, string(gwv1.GatewayConditionProgrammed)) &&
			len(g.Status.Addresses) == 1 && g.Status.Addresses[0].Value == "10.251.0.7"
		return ok, nil
	})
	poll("HTTPRoute Accepted", func() (bool, error) {
		r, err := gc.GatewayV1().HTTPRoutes(ns).Get(ctx, "r", metav1.GetOptions{})
		if err != nil || len(r.Status.Parents) != 1 {
			return false, err
		}
		return meta.IsStatusConditionTrue(r.Status.Parents[0].Conditions, string(gwv1.RouteConditionAccepted)) &&
			r.Status.Parents[0].ControllerName == ControllerName, nil
	})
	poll("GatewayClass Accepted", func() (bool, error) {
		g, err := gc.GatewayV1().GatewayClasses().Get(ctx, "flatnet", metav1.GetOptions{})
		return err == nil && meta.IsStatusConditionTrue(g.Status.Conditions, string(gwv1.GatewayClassConditionStatusAccepted)), err
	})
	poll("data plane port", func() (bool, error) {
		tb, _ := dp.current()
		p := tb.Ports[21000]
		if p == nil || p.Any == nil || len(p.Any.Rules) == 0 {
			return false, nil
		}
		b := p.Any.Rules[0].Action.Backends
		return len(b) == 1 && len(b[0].Endpoints) == 1 && b[0].Endpoints[0] == "10.244.0.5:8080", nil
	})

	// Settled: more syncs write nothing (no status, Service or slice churn).
	rv := func() string {
		g, _ := gc.GatewayV1().Gateways(ns).Get(ctx, "gw", metav1.GetOptions{})
		r, _ := gc.GatewayV1().HTTPRoutes(ns).Get(ctx, "r", metav1.GetOptions{})
		s, _ := kc.CoreV1().Services(ns).Get(ctx, "gw-flatnet-gw", metav1.GetOptions{})
		es, _ := kc.DiscoveryV1().EndpointSlices(ns).Get(ctx, "gw-flatnet-gw", metav1.GetOptions{})
		return g.ResourceVersion + "/" + r.ResourceVersion + "/" + s.ResourceVersion + "/" + es.ResourceVersion
	}
	time.Sleep(time.Second)
	before := rv()
	_, n0 := dp.current()
	for range 3 {
		c.Trigger()
		time.Sleep(300 * time.Millisecond)
	}
	if after := rv(); after != before {
		t.Fatalf("a sync with nothing changed wrote objects: %s -> %s", before, after)
	}
	if _, n1 := dp.current(); n1 <= n0 {
		t.Fatalf("triggers did not sync (%d -> %d)", n0, n1)
	}

	// Nodes reach the frontend without a compile (compile reads none): a
	// second Ready node joins the slice, and the slice, deleted behind
	// the controller's back, comes back.
	_, g0 := dp.current()
	createReadyNode(ctx, t, kc, "n2", "10.0.0.2")
	frontendHas := func(ips ...string) func() (bool, error) {
		return func() (bool, error) {
			es, err := kc.DiscoveryV1().EndpointSlices(ns).Get(ctx, "gw-flatnet-gw", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			var got []string
			for _, e := range es.Endpoints {
				got = append(got, e.Addresses...)
			}
			return slices.Equal(got, ips), fmt.Errorf("endpoints %v", got)
		}
	}
	poll("second node in the frontend slice", frontendHas("10.0.0.1", "10.0.0.2"))
	if err := kc.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "gw-flatnet-gw", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("frontend slice restored", frontendHas("10.0.0.1", "10.0.0.2"))
	if _, g1 := dp.current(); g1 != g0 {
		t.Fatalf("Node and frontend slice changes compiled the routes again (%d -> %d syncs)", g0, g1)
	}

	// The Gateway goes: its frontend goes with it.
	if err := gc.GatewayV1().Gateways(ns).Delete(ctx, "gw", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("frontend Service deleted", func() (bool, error) {
		_, err := kc.CoreV1().Services(ns).Get(ctx, "gw-flatnet-gw", metav1.GetOptions{})
		return err != nil, nil
	})
}
