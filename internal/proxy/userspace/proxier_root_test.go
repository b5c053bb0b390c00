package userspace_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/flatnet/flatnet/internal/proxy/proxier"
	"github.com/flatnet/flatnet/internal/proxy/userspace"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootProxier runs the userspace mode under the proxier, from API
// objects: a pod reaches the ClusterIP, follows an endpoint change while
// the listener stays, and a deleted Service's address leaves the node.
func TestRootProxier(t *testing.T) {
	const (
		nodeSide  = "10.246.116.1"
		podA      = "10.246.116.2"
		podB      = "10.246.116.3"
		clusterIP = "10.246.117.10"
	)
	testutil.RequireFreeRange(t, "10.246.116.0/24", "10.246.117.0/24")
	node, pod := testutil.NewNetNS(t), testutil.NewNetNS(t)
	testutil.Wire(t, node, testutil.Name("fun"), []string{nodeSide + "/24"}, pod, testutil.Name("fup"), []string{podA + "/24", podB + "/24"})
	testutil.RunIn(t, pod, "ip", "route", "add", "default", "via", nodeSide)
	testutil.EchoServer(t, pod, podA+":8080", "A")
	testutil.EchoServer(t, pod, podB+":8080", "B")

	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	slice := func(ip string) *discovery.EndpointSlice {
		return &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-abc", Labels: map[string]string{discovery.LabelServiceName: "web"}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(8080))}},
			Endpoints:   []discovery.Endpoint{{Addresses: []string{ip}}},
		}
	}
	cs := fake.NewClientset(svc, slice(podA))
	backend := userspace.New(userspace.Config{NetNS: node, NodeName: "node-a"})
	t.Cleanup(backend.Close)
	p := proxier.New(proxier.Config{Client: cs, Backend: backend, NodeName: "node-a", MaxSyncInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	to := net.JoinHostPort(clusterIP, "80")
	eventually(t, "the ClusterIP answers from A", func() (bool, string) {
		got, err := testutil.Ask(pod, to)
		return err == nil && strings.HasPrefix(got, "A "), got + " " + errString(err)
	})
	if _, err := cs.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice(podB), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ClusterIP answers from B", func() (bool, string) {
		got, err := testutil.Ask(pod, to)
		return err == nil && strings.HasPrefix(got, "B "), got + " " + errString(err)
	})
	if err := cs.CoreV1().Services("ns").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ClusterIP leaves the node", func() (bool, string) {
		lo := testutil.RunIn(t, node, "ip", "-o", "addr", "show", "dev", "lo")
		return !strings.Contains(lo, clusterIP), lo
	})
}

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ok, got := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %s", what, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func ptr[T any](v T) *T { return &v }
