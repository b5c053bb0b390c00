package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/flatnet/flatnet/internal/controller/lbipam"
	"github.com/flatnet/flatnet/internal/kube"
)

func lbService(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80}},
		},
	}
}

// lbIPs returns a Service's status.loadBalancer.ingress IPs, and its
// resourceVersion.
func lbIPs(t *testing.T, client kubernetes.Interface, name string) (string, string) {
	t.Helper()
	s, err := client.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ips := ""
	for _, ing := range s.Status.LoadBalancer.Ingress {
		ips += ing.IP + " "
	}
	return ips, s.ResourceVersion
}

func waitLBIP(t *testing.T, client kubernetes.Interface, name, want string) {
	t.Helper()
	var got string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		got, _ = lbIPs(t, client, name)
		return got == want, nil
	})
	if err != nil {
		t.Fatalf("service %s: load-balancer IPs %q, want %q", name, got, want)
	}
}

func waitEvent(t *testing.T, client kubernetes.Interface, reason, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return hasEvent(client, reason, name), nil
	})
	if err != nil {
		t.Fatalf("no %s event for %s", reason, name)
	}
}

// TestLoadBalancerIPsOnAPIServer runs `flatnet controller
// --load-balancer-ip-pool --load-balancer-ip-pool-configmap` against a
// real kube-apiserver: assignment (the apiserver accepts the status),
// exhaustion with an event, a restart that moves nothing and frees what a
// Service deleted meanwhile held, release and status cleared on a type
// change, and a ConfigMap edit growing the pool.
func TestLoadBalancerIPsOnAPIServer(t *testing.T) {
	kubeconfig, _ := apiserver(t)
	client, err := kube.Client(kubeconfig, "flatnet-controller-test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	svcs := client.CoreV1().Services("default")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "flatnet-lb"},
		Data: map[string]string{lbipam.PoolKey: "10.251.0.2"}}
	if _, err := client.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Another ConfigMap in the namespace is not watched and changes nothing.
	other := cm.DeepCopy()
	other.Name, other.Data = "unrelated", map[string]string{lbipam.PoolKey: "10.251.9.0/24"}
	if _, err := client.CoreV1().ConfigMaps("kube-system").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	o := Options{ClusterCIDR: "10.244.0.0/16", NodeCIDRMaskSize: 24, Workers: 2, KubeAPIQPS: DefaultKubeAPIQPS, KubeAPIBurst: DefaultKubeAPIBurst,
		LoadBalancerIPPool: "10.251.0.0/31", LoadBalancerIPPoolConfigMap: "kube-system/flatnet-lb"}
	stop := startController(t, client, o)

	for _, n := range []string{"a", "b", "c"} {
		if _, err := svcs.Create(ctx, lbService(n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitLBIP(t, client, n, fmt.Sprintf("10.251.0.%d ", n[0]-'a'))
	}
	waitEvent(t, client, lbipam.ReasonAllocated, "a")
	// The pool (flag and ConfigMap) is full: d waits with an event.
	if _, err := svcs.Create(ctx, lbService("d"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, client, lbipam.ReasonAllocationFailed, "d")
	if ips, _ := lbIPs(t, client, "d"); ips != "" {
		t.Fatalf("d got %q from a full pool", ips)
	}

	// Stopped, a leaves; the restarted controller gives a's address to d
	// and leaves b and c as they were.
	stop()
	_, bRV := lbIPs(t, client, "b")
	_, cRV := lbIPs(t, client, "c")
	if err := svcs.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	startController(t, client, o)
	waitLBIP(t, client, "d", "10.251.0.0 ")
	for name, rv := range map[string]string{"b": bRV, "c": cRV} {
		if _, now := lbIPs(t, client, name); now != rv {
			t.Errorf("service %s was written across the restart (resourceVersion %s -> %s)", name, rv, now)
		}
	}

	// b stops being a LoadBalancer: its status is cleared, its address
	// free for the next Service.
	b, err := svcs.Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Spec.Type = corev1.ServiceTypeClusterIP
	if _, err := svcs.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLBIP(t, client, "b", "")
	if _, err := svcs.Create(ctx, lbService("e"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLBIP(t, client, "e", "10.251.0.1 ")

	// The ConfigMap grows the pool: f, waiting, gets the new address.
	if _, err := svcs.Create(ctx, lbService("f"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, client, lbipam.ReasonAllocationFailed, "f")
	cm.Data[lbipam.PoolKey] = "10.251.0.2, 10.251.0.3"
	if _, err := client.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLBIP(t, client, "f", "10.251.0.3 ")
}
