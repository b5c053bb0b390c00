package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/netns"
)

// tcpConnect connects from inside the namespace at nsPath, as a process of
// that pod would: nil, or the dial's error (a denied flow times out).
func tcpConnect(nsPath, addr string, timeout time.Duration) error {
	return netns.Do(nsPath, func() error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestPolicy: the agent enforces NetworkPolicy (--network-policy, on in
// the lab). A default-deny ingress policy makes a TCP connect to the server
// time out, from a pod of its node and of another node, to its pod IP and
// to its Service's ClusterIP (the policy sees the flow after DNAT); its
// node still reaches it; an allow policy reopens it for one client only;
// deleting the policies reopens it for all.
func TestPolicy(t *testing.T) {
	l := startLab(t, 2)
	s := l.spec
	ctx := context.Background()
	n1, n2 := s.Nodes[0], s.Nodes[1]

	server := netexecPod("np-server", n1.Name)
	server.Labels = map[string]string{"role": "server"}
	l.create(t, server)
	near, far := netexecPod("np-near", n1.Name), netexecPod("np-far", n2.Name)
	near.Labels = map[string]string{"role": "near"}
	far.Labels = map[string]string{"role": "far"}
	l.create(t, near)
	l.create(t, far)
	serverIP := l.waitReady(t, "np-server").Status.PodIP
	l.waitReady(t, "np-near")
	l.waitReady(t, "np-far")
	svc, err := l.c.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "np-server"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"role": "server"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clients := map[string]string{
		"np-near": podNetns(t, s, n1, "default", "np-near"),
		"np-far":  podNetns(t, s, n2, "default", "np-far"),
	}
	targets := []string{net.JoinHostPort(serverIP, "8080"), net.JoinHostPort(svc.Spec.ClusterIP, "80")}

	// expect waits until every client's connects to every target are
	// allowed (or denied, by timing out) as open says, and logs when the
	// last probe agreed (a denied probe costs its 1 s timeout, so this is
	// an upper bound of the enforcement delay, not a measure of it).
	expect := func(what string, changed time.Time, open map[string]bool) {
		t.Helper()
		for client, nsPath := range clients {
			for _, to := range targets {
				var err error
				deadline := time.Now().Add(30 * time.Second)
				for {
					err = tcpConnect(nsPath, to, time.Second)
					if open[client] && err == nil || !open[client] && isTimeout(err) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s: %s -> %s: %v, want open=%v (a denied connect times out)", what, client, to, err, open[client])
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
		t.Logf("%s: all %d probes as expected by %s after the change", what, len(clients)*len(targets), time.Since(changed).Round(time.Millisecond))
	}
	expect("no policy", time.Now(), map[string]bool{"np-near": true, "np-far": true})

	nps := l.c.NetworkingV1().NetworkPolicies("default")
	serverSel := metav1.LabelSelector{MatchLabels: map[string]string{"role": "server"}}
	t0 := time.Now()
	if _, err := nps.Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-server"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("default deny", t0, map[string]bool{})
	// Node to pod is always allowed (the kubelet's probes).
	if _, err := httpGet(lab.NetnsPath(n1.Netns), net.JoinHostPort(serverIP, "8080"), "/hostname"); err != nil {
		t.Errorf("node %s -> server under default deny: %v (node to pod must stay open)", n1.Name, err)
	}

	t0 = time.Now()
	port := intstr.FromInt32(8080)
	if _, err := nps.Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-near"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: serverSel, Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "near"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("allow near", t0, map[string]bool{"np-near": true})

	t0 = time.Now()
	for _, name := range []string{"deny-server", "allow-near"} {
		if err := nps.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(fmt.Errorf("deleting %s: %w", name, err))
		}
	}
	expect("policies deleted", t0, map[string]bool{"np-near": true, "np-far": true})
}
