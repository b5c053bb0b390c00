package proxier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/nft/nfnl"
	"github.com/flatnet/flatnet/internal/proxy/conntrack"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/sysctl"
	"github.com/flatnet/flatnet/internal/testutil"
)

// nsNFT runs nft inside a test namespace (the exec'd nft inherits the
// locked thread's namespace).
type nsNFT struct {
	*nft.Runner
	ns string
}

func (n nsNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return netns.Do(n.ns, func() error { return n.Runner.Run(ctx, tx) })
}

func (n nsNFT) ListAll(ctx context.Context) (out map[string][]string, err error) {
	err = netns.Do(n.ns, func() error {
		out, err = n.Runner.ListAll(ctx)
		return err
	})
	return out, err
}

// requireNFT skips t unless it runs as root with nft installed.
func requireNFT(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := nft.LookPath(); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs nftables)", err)
	}
}

// tableFunc returns a uniquely named IPv4 table and a runner for it bound
// to the namespace ns.
type tableFunc func(t *testing.T, ns string) (string, nftables.NFT)

// nftRunners are the nftables mode's two ways to the kernel: nft
// processes, and netlink in process (nft/nfnl), as the agent does by
// default.
var nftRunners = []string{"exec", "netlink"}

// tableIn returns the tableFunc of one of nftRunners.
func tableIn(kind string) tableFunc {
	return func(t *testing.T, ns string) (string, nftables.NFT) {
		t.Helper()
		table := testutil.Name("fntproxy")
		if kind == "netlink" {
			r := nfnl.New(knftables.IPv4Family, table, nfnl.Options{NetNS: ns})
			t.Cleanup(func() { _ = r.Close() })
			return table, r
		}
		runner, err := nft.New(knftables.IPv4Family, table)
		if err != nil {
			t.Fatal(err)
		}
		return table, nsNFT{Runner: runner, ns: ns}
	}
}

// eachRunner runs test once per nftRunners.
func eachRunner(t *testing.T, test func(t *testing.T, tableIn tableFunc)) {
	for _, kind := range nftRunners {
		t.Run(kind, func(t *testing.T) { test(t, tableIn(kind)) })
	}
}

// nodeAndPod returns a "node" namespace (nodeAddr/24) wired to a "pod"
// namespace (podAddrs/24), the node routing serviceNet to the pod side:
// locally generated packets need a route before OUTPUT's DNAT runs.
func nodeAndPod(t *testing.T, nodeAddr, serviceNet string, podAddrs ...string) (node, pod string) {
	t.Helper()
	node, pod = testutil.NewNetNS(t), testutil.NewNetNS(t)
	veth := testutil.Name("fpn")
	var podNets []string
	for _, a := range podAddrs {
		podNets = append(podNets, a+"/24")
	}
	testutil.Wire(t, node, veth, []string{nodeAddr + "/24"}, pod, testutil.Name("fpp"), podNets)
	testutil.Run(t, "ip", "-n", testutil.NSName(node), "route", "add", serviceNet, "dev", veth)
	return node, pod
}

// runUntilCleanup runs p until the test ends; the cleanup (registered
// after the namespaces', so run before they go) stops it and checks Run.
func runUntilCleanup(t *testing.T, p *Proxier, ctx context.Context, cancel context.CancelFunc) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// TestRootClusterIP runs the proxier's real ruleset in a "node" namespace
// wired to a "pod" namespace: a client on the node reaches the pod through
// the ClusterIP, and once the service has no endpoints it is refused at once.
func TestRootClusterIP(t *testing.T) {
	forEachMode(t, func(t *testing.T, m kernelMode) {
		const (
			nodeAddr  = "10.246.77.1"
			podAddr   = "10.246.77.2"
			clusterIP = "10.246.96.10"
		)
		testutil.RequireFreeRange(t, "10.246.77.0/24", "10.246.96.0/24")
		node, pod := nodeAndPod(t, nodeAddr, "10.246.96.0/24", podAddr)
		_, portStr, _ := net.SplitHostPort(testutil.EchoServer(t, pod, podAddr+":0", "pod"))
		port, _ := strconv.Atoi(portStr)

		client := fake.NewClientset()
		startIn(t, m, node, client, nftables.Config{NodeName: "node-a",
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.246.77.0/24")}})
		ctx := context.Background()

		sl := slice("web", podAddr)
		sl.Ports[0].Port = ptr(int32(port))
		if _, err := client.CoreV1().Services("ns").Create(ctx, service("web", clusterIP), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		svcAddr := clusterIP + ":80"
		eventually(t, "the ClusterIP answers from the pod", func() (bool, string) {
			got, err := testutil.Ask(node, svcAddr)
			return err == nil && strings.HasPrefix(got, "pod "), fmt.Sprintf("%q %v", got, err)
		})

		// No endpoints: the connect is refused, not left to time out.
		sl.Endpoints = nil
		if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "a service without endpoints refuses", func() (bool, string) {
			_, err := testutil.Ask(node, svcAddr)
			return errors.Is(err, syscall.ECONNREFUSED), fmt.Sprint(err)
		})
		if out := m.dump(t, node); !strings.Contains(strings.ToLower(out), "reject") {
			t.Errorf("no reject rule:\n%s", out)
		}
	})
}

// TestRootNodePort: a client in another namespace reaches the pod through
// the node's address and the NodePort; the node forwards and masquerades
// (policy Cluster), so the pod sees the node as the client.
func TestRootNodePort(t *testing.T) {
	forEachMode(t, func(t *testing.T, m kernelMode) {
		const (
			nodePodSide = "10.246.79.1"
			podAddr     = "10.246.79.2"
			nodeExtSide = "10.246.80.1"
			clientAddr  = "10.246.80.2"
			nodePort    = 30080
		)
		testutil.RequireFreeRange(t, "10.246.79.0/24", "10.246.80.0/24", "10.246.97.0/24")
		client, node, pod := testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
		testutil.Wire(t, node, testutil.Name("fpn"), []string{nodePodSide + "/24"}, pod, testutil.Name("fpp"), []string{podAddr + "/24"})
		testutil.Wire(t, client, testutil.Name("fpc"), []string{clientAddr + "/24"}, node, testutil.Name("fpx"), []string{nodeExtSide + "/24"})
		if err := netns.Do(node, func() error { return sysctl.Set("net.ipv4.ip_forward", "1") }); err != nil {
			t.Fatal(err)
		}
		_, portStr, _ := net.SplitHostPort(testutil.EchoServer(t, pod, podAddr+":0", "pod"))
		port, _ := strconv.Atoi(portStr)

		svc := service("web", "10.246.97.10")
		svc.Spec.Type = v1.ServiceTypeNodePort
		svc.Spec.Ports[0].NodePort = nodePort
		sl := slice("web", podAddr)
		sl.Ports[0].Port = ptr(int32(port))
		startIn(t, m, node, fake.NewClientset(svc, sl), nftables.Config{NodeName: "node-a",
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.246.79.0/24")}})
		eventually(t, "the NodePort answers from the pod, masqueraded", func() (bool, string) {
			got, err := testutil.Ask(client, fmt.Sprintf("%s:%d", nodeExtSide, nodePort))
			return err == nil && got == "pod "+nodePodSide, fmt.Sprintf("%q %v", got, err)
		})
	})
}

// TestRootRestartReconciles: a new proxier (empty state, as after an agent
// restart) reads the real table and removes the chains and affinity set of
// a service deleted while it was down, keeping the others; a second full
// sync changes nothing.
func TestRootRestartReconciles(t *testing.T) {
	eachRunner(t, func(t *testing.T, tableIn tableFunc) {
		requireNFT(t)
		ctx := context.Background()
		node := testutil.NewNetNS(t)
		table, nsnft := tableIn(t, node)
		cfg := Config{NFT: nsnft, Render: nftables.Config{Family: knftables.IPv4Family, Table: table}}
		withAffinity := func(s *v1.Service) *v1.Service {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			return s
		}
		list := func() string { return testutil.RunIn(t, node, "nft", "list", "table", "ip", table) }

		first := New(cfg)
		first.tracker.OnService(service("web", "10.246.98.10"))
		first.tracker.OnEndpointSlice(slice("web", "10.246.99.2"))
		first.tracker.OnService(withAffinity(service("gone", "10.246.98.20")))
		first.tracker.OnEndpointSlice(slice("gone", "10.246.99.3"))
		if err := first.sync(ctx, true); err != nil {
			t.Fatal(err)
		}
		before := list()
		if !strings.Contains(before, "ns/gone/") || !strings.Contains(before, "set aff-") {
			t.Fatalf("first sync did not write ns/gone with its affinity set:\n%s", before)
		}

		second := New(cfg)
		second.tracker.OnService(service("web", "10.246.98.10"))
		second.tracker.OnEndpointSlice(slice("web", "10.246.99.2"))
		if err := second.sync(ctx, true); err != nil {
			t.Fatal(err)
		}
		after := list()
		if strings.Contains(after, "ns/gone/") || strings.Contains(after, "set aff-") || strings.Contains(after, "10.246.98.20") {
			t.Errorf("the restarted proxier left the deleted service behind:\n%s", after)
		}
		if !strings.Contains(after, "10.246.99.2:8080") || !strings.Contains(after, "10.246.98.10") {
			t.Errorf("the restarted proxier lost ns/web:\n%s", after)
		}
		if err := second.sync(ctx, true); err != nil {
			t.Fatal(err)
		}
		if again := list(); again != after {
			t.Errorf("a second full sync changed the table:\n%s\nthen:\n%s", after, again)
		}
	})
}

// nsConntrack runs the kernel's conntrack calls inside a test namespace.
type nsConntrack struct{ ns string }

func (c nsConntrack) List(ipv6 bool) (out []conntrack.Entry, err error) {
	err = netns.Do(c.ns, func() error {
		out, err = conntrack.Netlink{}.List(ipv6)
		return err
	})
	return out, err
}

func (c nsConntrack) Delete(ipv6 bool, filters []conntrack.Filter) (n int, err error) {
	err = netns.Do(c.ns, func() error {
		n, err = conntrack.Netlink{}.Delete(ipv6, filters)
		return err
	})
	return n, err
}

// udpServer answers every datagram on addr inside nsPath with name. It
// stops when the returned function is called or t ends.
func udpServer(t *testing.T, nsPath, addr, name string) (stop func()) {
	t.Helper()
	var pc net.PacketConn
	if err := netns.Do(nsPath, func() (err error) {
		pc, err = net.ListenPacket("udp", addr)
		return err
	}); err != nil {
		t.Fatalf("listening on udp %s: %v", addr, err)
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(name), from)
		}
	}()
	t.Cleanup(func() { pc.Close() })
	return func() { pc.Close() }
}

// TestRootUDPEndpointReplaced: a UDP client that keeps one socket (one
// source port, so one conntrack entry) to a ClusterIP keeps getting
// answers after its endpoint is replaced by another: the proxier deletes
// the entry DNATed to the old endpoint. Without the cleanup every datagram
// would still go to the old endpoint until the client paused for the
// conntrack timeout.
func TestRootUDPEndpointReplaced(t *testing.T) {
	eachRunner(t, func(t *testing.T, tableIn tableFunc) {
		requireNFT(t)
		const (
			nodeAddr  = "10.246.81.1"
			podA      = "10.246.81.2"
			podB      = "10.246.81.3"
			clusterIP = "10.246.98.53"
			port      = 5353
		)
		testutil.RequireFreeRange(t, "10.246.81.0/24", "10.246.98.0/24")
		node, pod := nodeAndPod(t, nodeAddr, "10.246.98.0/24", podA, podB)
		stopA := udpServer(t, pod, fmt.Sprintf("%s:%d", podA, port), "A")
		udpServer(t, pod, fmt.Sprintf("%s:%d", podB, port), "B")

		table, nsnft := tableIn(t, node)
		svc := udpService("dns", clusterIP)
		svc.Spec.Type = v1.ServiceTypeClusterIP
		svc.Spec.Ports[0].NodePort = 0
		sl := udpSlice("dns", podA)
		sl.Ports[0].Port = ptr(int32(port))
		client := fake.NewClientset(svc, sl)
		ctx, cancel := context.WithCancel(context.Background())
		p := New(Config{
			Client: client, NFT: nsnft,
			Render:          nftables.Config{Family: knftables.IPv4Family, Table: table, NodeName: "node-a"},
			MaxSyncInterval: time.Hour,
			Conntrack:       nsConntrack{ns: node},
		})
		runUntilCleanup(t, p, ctx, cancel)

		// One connected socket for the whole test: its source port never
		// changes, so every datagram belongs to one conntrack entry.
		var conn net.Conn
		if err := netns.Do(node, func() (err error) {
			conn, err = net.Dial("udp", clusterIP+":53")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ask := func() (string, error) {
			if _, err := conn.Write([]byte("ping")); err != nil {
				return "", err
			}
			_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			buf := make([]byte, 64)
			n, err := conn.Read(buf)
			return string(buf[:n]), err
		}
		eventually(t, "the ClusterIP answers from endpoint A", func() (bool, string) {
			got, err := ask()
			return got == "A", fmt.Sprintf("%q %v", got, err)
		})
		if out := testutil.RunIn(t, node, "nft", "list", "table", "ip", table); !strings.Contains(out, podA) {
			t.Fatalf("no DNAT to %s:\n%s", podA, out)
		}

		// A goes away and B replaces it; the client keeps its socket and
		// keeps sending.
		stopA()
		sl.Endpoints[0].Addresses = []string{podB}
		if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the same socket gets answers from endpoint B", func() (bool, string) {
			got, err := ask()
			return got == "B", fmt.Sprintf("%q %v", got, err)
		})
	})
}

// TestRootPartialSyncNewLocalService: a LoadBalancer with
// externalTrafficPolicy Local added after the first sync goes through a
// partial sync the kernel accepts (its ext- chain refers to svc- and svl-
// chains added in the same transaction).
func TestRootPartialSyncNewLocalService(t *testing.T) {
	eachRunner(t, func(t *testing.T, tableIn tableFunc) {
		requireNFT(t)
		ctx := context.Background()
		node := testutil.NewNetNS(t)
		table, nsnft := tableIn(t, node)
		p := New(Config{NFT: nsnft, Render: nftables.Config{Family: knftables.IPv4Family, Table: table,
			NodeName: "node-a", ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.246.99.0/24")}}})
		p.tracker.OnService(service("web", "10.246.98.10"))
		p.tracker.OnEndpointSlice(slice("web", "10.246.99.2"))
		if err := p.sync(ctx, true); err != nil {
			t.Fatal(err)
		}
		lb := service("lb", "10.246.98.20")
		lb.Spec.Type = v1.ServiceTypeLoadBalancer
		lb.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		lb.Spec.Ports[0].NodePort = 30777
		sl := slice("lb", "10.246.99.3", "10.246.99.4")
		sl.Endpoints[0].NodeName = ptr("node-a")
		p.tracker.OnService(lb)
		p.tracker.OnEndpointSlice(sl)
		if err := p.sync(ctx, false); err != nil {
			t.Fatalf("partial sync of a new policy-Local LoadBalancer: %v", err)
		}
		if out := testutil.RunIn(t, node, "nft", "list", "table", "ip", table); !strings.Contains(out, "svl-") || !strings.Contains(out, "30777") {
			t.Errorf("the LoadBalancer's chains are missing:\n%s", out)
		}
	})
}

// TestRootDriftRepairedUnderChurn is TestDriftRepairedUnderChurn against
// the kernel: the foreign edits are nft commands run in the namespace, and
// the full resync the runner forces within a period puts web's map element
// and rule back while busy's endpoint keeps moving.
func TestRootDriftRepairedUnderChurn(t *testing.T) {
	eachRunner(t, func(t *testing.T, tableIn tableFunc) {
		requireNFT(t)
		ns := testutil.NewNetNS(t)
		table, nsnft := tableIn(t, ns)
		p, clock := startChurn(t, nsnft, table)
		// chainOf lists the rules of svc's service chain.
		chainOf := func(svc string) (name, rules string) {
			all, err := nsnft.ListAll(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range all["chain"] {
				if strings.HasPrefix(c, "svc-") && strings.Contains(c, "ns/"+svc+"/") {
					return c, testutil.RunIn(t, ns, "nft", "list", "chain", "ip", table, c)
				}
			}
			t.Fatalf("no chain of ns/%s in %v", svc, all["chain"])
			return "", ""
		}
		dnatTo := regexp.MustCompile(`dnat to (\S+)`)
		driveChurn(t, p, clock, churnTable{
			breakWeb: func() {
				chain, _ := chainOf("web")
				testutil.RunIn(t, ns, "nft", "delete", "element", "ip", table, "service-ips", "{ 10.96.0.10 . tcp . 80 }")
				testutil.RunIn(t, ns, "nft", "flush", "chain", "ip", table, chain)
			},
			webOK: func() bool {
				elems := testutil.RunIn(t, ns, "nft", "list", "map", "ip", table, "service-ips")
				_, rules := chainOf("web")
				return strings.Contains(elems, "10.96.0.10 . tcp . 80 : goto") && strings.Contains(rules, "dnat to 10.244.2.7:8080")
			},
			busyAt: func() string {
				_, rules := chainOf("busy")
				if m := dnatTo.FindStringSubmatch(rules); m != nil {
					return m[1]
				}
				return ""
			},
		})
	})
}
