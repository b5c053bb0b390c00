package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/lab/simnodes"
	"github.com/flatnet/flatnet/internal/proc"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestLabSimulatedNodes runs a lab of one real node and 20 simulated ones
// (kwok): every simulated node Ready with a podCIDR; 40 pods bound to them
// Running with IPs from their node's podCIDR and listed by their Service's
// EndpointSlices; the real node's agent routing each simulated podCIDR via
// the node's InternalIP inside its namespace (host-gw). Then the lab shrinks
// to 5 simulated nodes (15 nodes, their 30 pods, their routes and endpoints
// go), and down leaves no kwok running.
func TestLabSimulatedNodes(t *testing.T) {
	if _, err := simnodes.KwokBinary(); err != nil {
		testutil.Skip(t, "%v", err)
	}
	const want, pods, shrunk = 20, 40, 5
	l := startLab(t, 1, "--simulated-nodes", strconv.Itoa(want))
	ctx := context.Background()
	if l.spec.SimulatedNodes != want || !l.spec.SimulatedNodeRange.IsValid() {
		t.Fatalf("lab.json records %d simulated nodes in %s, want %d in a range", l.spec.SimulatedNodes, l.spec.SimulatedNodeRange, want)
	}

	// Every simulated node: Ready, a podCIDR, its own InternalIP.
	cidrs := simulatedNodes(t, l, want)

	// A Service and 40 pods on the simulated nodes (two a node).
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "sim", Namespace: "default"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "sim"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := l.c.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range pods {
		node := simnodes.Name(l.name, i%want+1)
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("sim-%02d", i), Namespace: "default", Labels: map[string]string{"app": "sim"}},
			Spec: corev1.PodSpec{NodeName: node,
				Containers: []corev1.Container{{Name: "c", Image: "never-pulled", Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}}},
		}
		if _, err := l.c.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ips := simulatedPods(t, l, cidrs, pods)
	l.waitEndpoints(t, "sim", func(ready, notReady map[string]bool) bool {
		return len(notReady) == 0 && mapsEqualKeys(ready, ips)
	})

	// The real node routes each simulated podCIDR via its InternalIP.
	n1 := l.spec.Nodes[0]
	waitRoutes(t, n1.Netns, cidrs)

	out := l.mustCLI(t, "status")
	if !strings.Contains(out, fmt.Sprintf("simulated:     %d of %d nodes", want, want)) ||
		!strings.Contains(out, fmt.Sprintf("%d pods on them, %d Running", pods, pods)) {
		t.Errorf("lab status does not count %d simulated nodes and %d pods:\n%s", want, pods, out)
	}

	// Shrink: 15 nodes and their 30 pods go, and with them their routes
	// and endpoints.
	t0 := time.Now()
	out = l.mustCLI(t, "up", "--simulated-nodes", strconv.Itoa(shrunk))
	t.Logf("lab up --simulated-nodes %d took %s:\n%s", shrunk, time.Since(t0).Round(time.Millisecond), out)
	kept := simulatedNodes(t, l, shrunk)
	for name := range cidrs {
		if _, ok := kept[name]; !ok {
			delete(cidrs, name)
		}
	}
	if len(cidrs) != shrunk {
		t.Fatalf("after shrinking, %d of the first nodes remain (%v), want %d", len(cidrs), kept, shrunk)
	}
	left := simulatedPods(t, l, cidrs, pods*shrunk/want)
	l.waitEndpoints(t, "sim", func(ready, notReady map[string]bool) bool {
		return len(notReady) == 0 && mapsEqualKeys(ready, left)
	})
	waitRoutes(t, n1.Netns, cidrs)

	// Down stops kwok (and checkNoProcessLeft, at cleanup, everything).
	pid, ok := proc.Running(l.spec.StateDir, lab.ProcKwok)
	if !ok {
		t.Fatal("kwok is not running before down")
	}
	l.takeDown(t)
	if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmd), "kwok") {
		t.Errorf("kwok (pid %d) still runs after lab down", pid)
	}
}

// simulatedNodes waits until exactly n simulated nodes exist, named 1..n,
// each Ready with a podCIDR and its own InternalIP, and returns their
// podCIDRs and InternalIPs by name.
func simulatedNodes(t *testing.T, l *testLab, n int) map[string]simNode {
	t.Helper()
	var got map[string]simNode
	err := retry(60*time.Second, func() error {
		list, err := l.c.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{LabelSelector: simnodes.Selector(l.name)})
		if err != nil {
			return err
		}
		got = map[string]simNode{}
		for _, kn := range list.Items {
			i, ok := simnodes.Index(l.name, kn.Name)
			if !ok || i > n {
				return fmt.Errorf("node %s is still there", kn.Name)
			}
			cidr, err := netip.ParsePrefix(kn.Spec.PodCIDR)
			if err != nil || !kube.NodeReady(&kn) {
				return fmt.Errorf("node %s: podCIDR %q, Ready %v", kn.Name, kn.Spec.PodCIDR, kube.NodeReady(&kn))
			}
			wantIP, _ := simnodes.InternalIP(l.spec.SimulatedNodeRange, i)
			var ip netip.Addr
			for _, a := range kn.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					ip, _ = netip.ParseAddr(a.Address)
				}
			}
			if ip != wantIP {
				return fmt.Errorf("node %s has InternalIP %s, want %s", kn.Name, ip, wantIP)
			}
			got[kn.Name] = simNode{cidr: cidr, ip: ip}
		}
		if len(got) != n {
			return fmt.Errorf("%d simulated nodes, want %d", len(got), n)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("simulated nodes: %v", err)
	}
	return got
}

type simNode struct {
	cidr netip.Prefix
	ip   netip.Addr
}

func (n simNode) String() string { return n.cidr.String() + " via " + n.ip.String() }

// simulatedPods waits until exactly n pods run on the simulated nodes,
// each Running with a unique IP inside its node's podCIDR and its node's
// InternalIP as host IP, and returns the IPs.
func simulatedPods(t *testing.T, l *testLab, nodes map[string]simNode, n int) map[string]bool {
	t.Helper()
	var ips map[string]bool
	err := retry(60*time.Second, func() error {
		list, err := l.c.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=sim"})
		if err != nil {
			return err
		}
		ips = map[string]bool{}
		for _, p := range list.Items {
			node, ok := nodes[p.Spec.NodeName]
			if !ok {
				return fmt.Errorf("pod %s is on %s, which is not a simulated node wanted", p.Name, p.Spec.NodeName)
			}
			ip, err := netip.ParseAddr(p.Status.PodIP)
			if p.Status.Phase != corev1.PodRunning || err != nil {
				return fmt.Errorf("pod %s: phase %s, IP %q", p.Name, p.Status.Phase, p.Status.PodIP)
			}
			if !node.cidr.Contains(ip) || p.Status.HostIP != node.ip.String() {
				return fmt.Errorf("pod %s on %s has IP %s and host IP %s, want one in %s and %s", p.Name, p.Spec.NodeName, ip, p.Status.HostIP, node.cidr, node.ip)
			}
			if ips[ip.String()] {
				return fmt.Errorf("pod %s has IP %s, which another pod has", p.Name, ip)
			}
			ips[ip.String()] = true
		}
		if len(ips) != n {
			return fmt.Errorf("%d pods, want %d", len(ips), n)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pods on simulated nodes: %v", err)
	}
	return ips
}

// waitRoutes waits until the node namespace netns routes each simulated
// node's podCIDR via its InternalIP on eth0, and no other podCIDR of the
// simulated node range.
func waitRoutes(t *testing.T, netns string, nodes map[string]simNode) {
	t.Helper()
	var have []string
	err := retry(30*time.Second, func() error {
		out, err := exec.Command("ip", "netns", "exec", netns, "ip", "-4", "route", "show").CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip route in %s: %w: %s", netns, err, out)
		}
		have = have[:0]
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			// The agent's routes go through nexthop objects: "DST nhid N via GW dev DEV".
			if f := strings.Fields(line); len(f) >= 7 && f[1] == "nhid" {
				line = strings.Join(append(f[:1:1], f[3:]...), " ")
			}
			if f := strings.Fields(line); len(f) >= 5 && f[1] == "via" && f[3] == "dev" {
				have = append(have, f[0]+" via "+f[2]+" dev "+f[4])
			}
		}
		var want []string
		for _, n := range nodes {
			want = append(want, n.cidr.String()+" via "+n.ip.String()+" dev eth0")
		}
		slices.Sort(want)
		slices.Sort(have)
		if !slices.Equal(want, have) {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("routes via the simulated nodes in %s: have %v, want one per node of %v", netns, have, nodes)
	}
}

func mapsEqualKeys(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}
