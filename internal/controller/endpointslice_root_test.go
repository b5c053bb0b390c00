package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/flatnet/flatnet/internal/endpointslice"
	"github.com/flatnet/flatnet/internal/kube"
)

// TestEndpointSlicesOnAPIServer runs `flatnet controller --endpointslices`
// against a real kube-apiserver (no kube-controller-manager, so no
// garbage collector): slices appear for a Service's ready pods, follow a
// pod's deletion in place, and go when the Service goes.
func TestEndpointSlicesOnAPIServer(t *testing.T) {
	kubeconfig, _ := apiserver(t)
	client, err := kube.Client(kubeconfig, "flatnet-controller-test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	o := Options{ClusterCIDR: "10.244.0.0/22", NodeCIDRMaskSize: 24, EndpointSlices: true, MaxEndpointsPerSlice: 100, Workers: 2, EndpointSliceWorkers: 4,
		KubeAPIQPS: DefaultKubeAPIQPS, KubeAPIBurst: DefaultKubeAPIBurst}
	stop := startController(t, client, o)
	defer stop()
	createReadyNode(t, client, "n1")

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("web-%d", i), Namespace: "default", Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{
				Name: "c", Image: "none", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(8080 + i)}},
			}}},
		}
		p, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ip := fmt.Sprintf("10.244.0.%d", 10+i)
		p.Status = corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		}
		if _, err := client.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Two pods, two port numbers for the one named port: two slices.
	slices := waitSlices(t, client, "web", func(ss []discovery.EndpointSlice) bool {
		n := 0
		for _, s := range ss {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					n++
				}
			}
		}
		return len(ss) == 2 && n == 2
	})
	names := map[string]bool{}
	for _, s := range slices {
		names[s.Name] = true
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Service" || s.OwnerReferences[0].Name != "web" {
			t.Errorf("slice %s owners %v", s.Name, s.OwnerReferences)
		}
		if len(s.Ports) != 1 || len(s.Endpoints) != 1 {
			t.Fatalf("slice %s: ports %v, %d endpoints", s.Name, s.Ports, len(s.Endpoints))
		}
		// web-0 serves http on 8080, web-1 on 8081.
		want := int32(8080)
		if s.Endpoints[0].TargetRef.Name == "web-1" {
			want = 8081
		}
		if *s.Ports[0].Port != want {
			t.Errorf("slice %s: port %d for %s, want %d", s.Name, *s.Ports[0].Port, s.Endpoints[0].TargetRef.Name, want)
		}
	}

	// web-1 goes: its slice is deleted, web-0's stays.
	if err := client.CoreV1().Pods("default").Delete(ctx, "web-1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	after := waitSlices(t, client, "web", func(ss []discovery.EndpointSlice) bool {
		return len(ss) == 1 && len(ss[0].Endpoints) == 1 && ss[0].Endpoints[0].TargetRef.Name == "web-0"
	})
	if !names[after[0].Name] {
		t.Errorf("slice %s is new; want one of %v kept", after[0].Name, names)
	}

	if err := client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSlices(t, client, "web", func(ss []discovery.EndpointSlice) bool { return len(ss) == 0 })
}

// waitSlices waits until flatnet's slices of service satisfy ok.
func waitSlices(t *testing.T, client kubernetes.Interface, service string, ok func([]discovery.EndpointSlice) bool) []discovery.EndpointSlice {
	t.Helper()
	var last []discovery.EndpointSlice
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{
			LabelSelector: discovery.LabelServiceName + "=" + service + "," + discovery.LabelManagedBy + "=" + endpointslice.ManagedBy,
		})
		if err != nil {
			return false, err
		}
		last = l.Items
		return ok(last), nil
	})
	if err != nil {
		t.Fatalf("EndpointSlices of %s: %v; last seen %+v", service, err, last)
	}
	return last
}
