package proxier

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proxy/iptables"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/sysctl"
	"github.com/flatnet/flatnet/internal/testutil"
)

// kernelMode is a proxy mode whose rules the root tests run packets
// through: each test runs once per mode.
type kernelMode struct {
	name string
	// config returns a proxier Config programming the namespace ns in
	// this mode for IPv4 as r says (its Table is ignored).
	config func(t *testing.T, ns string, r nftables.Config) Config
	// dump lists the mode's rules in ns.
	dump func(t *testing.T, ns string) string
}

// kernelModes are the nftables mode with each of nftRunners, and the
// iptables mode.
var kernelModes = func() []kernelMode {
	var modes []kernelMode
	for _, kind := range nftRunners {
		modes = append(modes, kernelMode{
			name: "nftables-" + kind,
			config: func(t *testing.T, ns string, r nftables.Config) Config {
				requireNFT(t)
				table, nsnft := tableIn(kind)(t, ns)
				r.Family, r.Table = knftables.IPv4Family, table
				return Config{NFT: nsnft, Render: r}
			},
			dump: func(t *testing.T, ns string) string {
				return testutil.RunIn(t, ns, "nft", "list", "ruleset")
			},
		})
	}
	return append(modes, kernelMode{
		name: "iptables",
		config: func(t *testing.T, ns string, r nftables.Config) Config {
			testutil.RequireRoot(t)
			if err := ipt.Available(ipt.IPv4); err != nil {
				testutil.Skip(t, "%v (hack/deps.sh installs iptables)", err)
			}
			b := iptables.NewBackend(ipt.InNetNS{Path: ns, Runner: ipt.New()}, iptables.Config{
				Family: ipt.IPv4, NodeName: r.NodeName, ClusterCIDRs: r.ClusterCIDRs, NodePortAddresses: r.NodePortAddresses,
			})
			return Config{Backend: b, NodeName: r.NodeName}
		},
		dump: func(t *testing.T, ns string) string {
			return testutil.RunIn(t, ns, "iptables-save", "-t", "nat") + testutil.RunIn(t, ns, "iptables-save", "-t", "filter")
		},
	})
}()

// forEachMode runs test once per kernel mode, as subtests.
func forEachMode(t *testing.T, test func(t *testing.T, m kernelMode)) {
	for _, m := range kernelModes {
		t.Run(m.name, func(t *testing.T) { test(t, m) })
	}
}

// startIn runs a proxier for client in mode m, programming ns, until the
// test ends.
func startIn(t *testing.T, m kernelMode, ns string, client *fake.Clientset, r nftables.Config) {
	t.Helper()
	cfg := m.config(t, ns, r)
	cfg.Client, cfg.MaxSyncInterval = client, time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	runUntilCleanup(t, New(cfg), ctx, cancel)
}

// clientNodePods wires a client namespace (clientNet.2/24) and a pod
// namespace (podAddrs/24 in podNet) to a node namespace (podNet.1,
// clientNet.1) that forwards between them; the node routes serviceNet to
// the pod side, the pods route everything through the node.
func clientNodePods(t *testing.T, podNet, clientNet, serviceNet string, podAddrs ...string) (client, node, pod, nodeExtSide, clientAddr string) {
	t.Helper()
	testutil.RequireFreeRange(t, podNet+".0/24", clientNet+".0/24", serviceNet)
	nodeExtSide, clientAddr = clientNet+".1", clientNet+".2"
	node, pod = nodeAndPod(t, podNet+".1", serviceNet, podAddrs...)
	testutil.Run(t, "ip", "-n", testutil.NSName(pod), "route", "add", "default", "via", podNet+".1")
	client = testutil.NewNetNS(t)
	testutil.Wire(t, client, testutil.Name("fpc"), []string{clientAddr + "/24"}, node, testutil.Name("fpx"), []string{nodeExtSide + "/24"})
	if err := netns.Do(node, func() error { return sysctl.Set("net.ipv4.ip_forward", "1") }); err != nil {
		t.Fatal(err)
	}
	return client, node, pod, nodeExtSide, clientAddr
}

// TestRootSessionAffinity: with sessionAffinity ClientIP a client reaches
// the same endpoint of two every time.
func TestRootSessionAffinity(t *testing.T) {
	forEachMode(t, func(t *testing.T, m kernelMode) {
		const (
			nodeAddr  = "10.246.82.1"
			podA      = "10.246.82.2"
			podB      = "10.246.82.3"
			clusterIP = "10.246.100.10"
		)
		testutil.RequireFreeRange(t, "10.246.82.0/24", "10.246.100.0/24")
		node, pod := nodeAndPod(t, nodeAddr, "10.246.100.0/24", podA, podB)
		testutil.EchoServer(t, pod, podA+":8080", "A")
		testutil.EchoServer(t, pod, podB+":8080", "B")
		svc := service("sticky", clusterIP)
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(600))}}
		startIn(t, m, node, fake.NewClientset(svc, slice("sticky", podA, podB)), nftables.Config{NodeName: "node-a"})

		var first string
		eventually(t, "the ClusterIP answers", func() (bool, string) {
			got, err := testutil.Ask(node, clusterIP+":80")
			first = strings.Fields(got + " ?")[0]
			return err == nil, fmt.Sprintf("%q %v", got, err)
		})
		for i := 0; i < 20; i++ {
			got, err := testutil.Ask(node, clusterIP+":80")
			if err != nil || !strings.HasPrefix(got, first+" ") {
				t.Fatalf("connection %d: %q %v, want endpoint %s every time", i, got, err, first)
			}
		}
	})
}

// TestRootTrafficPolicyLocal: externalTrafficPolicy Local keeps a
// NodePort client's source address and only uses this node's endpoint;
// internalTrafficPolicy Local does the same for ClusterIP traffic; with no
// endpoint on this node, external traffic is dropped, not refused.
func TestRootTrafficPolicyLocal(t *testing.T) {
	forEachMode(t, func(t *testing.T, m kernelMode) {
		const (
			local     = "10.246.83.2"
			remote    = "10.246.83.3"
			clusterIP = "10.246.101.10"
			nodePort  = 30083
		)
		client, node, pod, nodeExtSide, clientAddr := clientNodePods(t, "10.246.83", "10.246.85", "10.246.101.0/24", local, remote)
		testutil.EchoServer(t, pod, local+":8080", "local")
		testutil.EchoServer(t, pod, remote+":8080", "remote")
		etp := service("etp", clusterIP)
		etp.Spec.Type = v1.ServiceTypeNodePort
		etp.Spec.Ports[0].NodePort = nodePort
		etp.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		itpLocal := v1.ServiceInternalTrafficPolicyLocal
		etp.Spec.InternalTrafficPolicy = &itpLocal
		sl := slice("etp", local, remote)
		sl.Endpoints[0].NodeName = ptr("node-a")
		cs := fake.NewClientset(etp, sl)
		startIn(t, m, node, cs, nftables.Config{NodeName: "node-a",
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.246.83.0/24")}})

		np := fmt.Sprintf("%s:%d", nodeExtSide, nodePort)
		eventually(t, "the NodePort answers", func() (bool, string) {
			got, err := testutil.Ask(client, np)
			return err == nil, fmt.Sprintf("%q %v", got, err)
		})
		for i := 0; i < 10; i++ {
			if got, err := testutil.Ask(client, np); err != nil || got != "local "+clientAddr {
				t.Fatalf("NodePort connection %d: %q %v, want the local endpoint seeing %s", i, got, err, clientAddr)
			}
			if got, err := testutil.Ask(node, clusterIP+":80"); err != nil || !strings.HasPrefix(got, "local ") {
				t.Fatalf("ClusterIP connection %d: %q %v, want the local endpoint", i, got, err)
			}
		}

		// Only a remote endpoint left: external clients are dropped.
		sl.Endpoints = sl.Endpoints[1:]
		if _, err := cs.DiscoveryV1().EndpointSlices("ns").Update(context.Background(), sl, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the NodePort drops without a local endpoint", func() (bool, string) {
			_, err := testutil.Ask(client, np)
			var to interface{ Timeout() bool }
			return errors.As(err, &to) && to.Timeout(), fmt.Sprint(err)
		})
	})
}

// TestRootNoEndpointsRefused: a service with no endpoints is refused at
// once on its ClusterIP and its NodePort, and so is a port the ClusterIP
// does not have.
func TestRootNoEndpointsRefused(t *testing.T) {
	forEachMode(t, func(t *testing.T, m kernelMode) {
		const (
			podAddr   = "10.246.84.2"
			clusterIP = "10.246.102.10"
			nodePort  = 30084
		)
		client, node, pod, nodeExtSide, _ := clientNodePods(t, "10.246.84", "10.246.86", "10.246.102.0/24", podAddr)
		testutil.EchoServer(t, pod, podAddr+":8080", "pod")
		svc := service("empty", clusterIP)
		svc.Spec.Type = v1.ServiceTypeNodePort
		svc.Spec.Ports[0].NodePort = nodePort
		web := service("web", "10.246.102.11")
		startIn(t, m, node, fake.NewClientset(svc, web, slice("web", podAddr)), nftables.Config{NodeName: "node-a"})
		eventually(t, "web answers", func() (bool, string) {
			got, err := testutil.Ask(node, "10.246.102.11:80")
			return err == nil, fmt.Sprintf("%q %v", got, err)
		})
		for _, c := range []struct{ from, addr string }{
			{node, clusterIP + ":80"},
			{client, fmt.Sprintf("%s:%d", nodeExtSide, nodePort)},
			{node, "10.246.102.11:81"}, // a port web does not have
		} {
			start := time.Now()
			_, err := testutil.Ask(c.from, c.addr)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s: %v, want connection refused", c.addr, err)
			}
			t.Logf("%s refused in %v", c.addr, time.Since(start))
		}
	})
}
