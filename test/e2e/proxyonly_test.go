package e2e

// `flatnet agent --proxy-only` serving Services for a node that uses
// another CNI.
//
// Next to a 2-node lab the test builds a node of its own, as another CNI
// and kube-proxy's host would have it, and runs flatnet there only as
// kube-proxy's replacement:
//
//	lab underlay bridge fl-<lab> ────────────────────────────┐
//	  │ node 1 .11          │ node 2 .12                     │ veth fl-<lab>-o
//	  │ 10.245.0.0/24       │ 10.245.0.0/24                  │
//	  │   via .240 (added)  │   via .240 (added)             │
//	                                     netns fl-<lab>-other: eth0 .240
//	                                       routes: each lab node's podCIDR via its IP,
//	                                       the service CIDR on-link (as lab nodes)
//	                                       cni0 10.245.0.1 (REFERENCE bridge + host-local)
//	                                       flatnet agent --proxy-only --config kube-proxy.yaml
//	                                         netns fl-<lab>-opod: eth0 10.245.0.x, flatnet netexec
//
// The other CNI's pod range, 10.245.0.0/24, lies outside the lab's cluster
// CIDR (10.244.0.0/16); the kube-proxy configuration's clusterCIDR,
// 10.244.0.0/15, covers both, as a cluster's would.
//
// Routing back: a lab pod answering the other node's pod must reach
// 10.245.0.0/24. The test adds that route (via the other node's address)
// inside the lab's node namespaces, where the other CNI's routing would
// put it; they are this test's namespaces, and the lab agent manages only
// routes of its own protocol, so it leaves this one alone. The other
// choice, masquerading the pod's traffic on its node, would hide the
// client address, which the test checks instead: the proxy must not
// masquerade ClusterIP traffic from a pod (kube-proxy does not).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
	"github.com/flatnet/flatnet/internal/sysctl"
	"github.com/flatnet/flatnet/internal/testutil"
)

const (
	// The other CNI's pod subnet and the cluster CIDR covering it and the
	// lab's default 10.244.0.0/16.
	otherPodSubnet   = "10.245.0.0/24"
	otherClusterCIDR = "10.244.0.0/15"
	otherNodeHost    = 240 // the other node's address on the underlay: .240
	// A second address of the other node, outside its nodePortAddresses.
	otherNodeHost2 = 241
)

// nthAddr is the address n after p's network address.
func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// otherNode is the test's node with another CNI.
type otherNode struct {
	netns, podNetns string // names under /run/netns
	hostVeth        string
	ip              netip.Addr
	podIP           string
	name            string // the Node name the proxy is told (no Node object exists)
}

func (o *otherNode) path() string    { return lab.NetnsPath(o.netns) }
func (o *otherNode) podPath() string { return lab.NetnsPath(o.podNetns) }

// ipIn runs ip(8) inside the namespace at nsPath.
func ipIn(t *testing.T, nsPath string, args ...string) string {
	t.Helper()
	return testutil.Run(t, append([]string{"ip", "-n", filepath.Base(nsPath)}, args...)...)
}

// newOtherNode builds the node namespace on the lab's underlay, with routes
// to the lab nodes' pod subnets and the service CIDR, and the lab nodes'
// routes back to its pod subnet. Everything is removed when t ends.
func newOtherNode(t *testing.T, l *testLab) *otherNode {
	t.Helper()
	s := l.spec
	if s.ClusterCIDR != netip.MustParsePrefix("10.244.0.0/16") {
		t.Fatalf("the test expects the lab's default cluster CIDR 10.244.0.0/16, not %s", s.ClusterCIDR)
	}
	o := &otherNode{
		// Named under the lab's name, so a lab test running at the same
		// time tells them from leftovers on the machine (host_test.go).
		netns:    "fl-" + l.name + "-other",
		podNetns: "fl-" + l.name + "-opod",
		hostVeth: "fl-" + l.name + "-o",
		ip:       nthAddr(s.Underlay, otherNodeHost),
		name:     l.name + "-other",
	}
	if len(o.hostVeth) > 15 {
		t.Fatalf("interface name %s too long", o.hostVeth)
	}
	for _, n := range s.Nodes {
		if n.IP == o.ip {
			t.Fatalf("%s is lab node %s's address", o.ip, n.Name)
		}
	}
	if _, err := netns.Create(o.netns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The veth goes with the namespace; deleting it first also frees
		// the lab's bridge should a process still hold the namespace.
		_ = exec.Command("ip", "link", "del", o.hostVeth).Run()
		if err := netns.Delete(o.netns); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	testutil.Run(t, "ip", "link", "add", o.hostVeth, "type", "veth", "peer", "name", "eth0", "netns", o.netns)
	testutil.Run(t, "ip", "link", "set", o.hostVeth, "master", s.Bridge, "up")
	ipIn(t, o.path(), "link", "set", "lo", "up")
	ipIn(t, o.path(), "addr", "add", netip.PrefixFrom(o.ip, s.Underlay.Bits()).String(), "dev", "eth0")
	ipIn(t, o.path(), "addr", "add", netip.PrefixFrom(nthAddr(s.Underlay, otherNodeHost2), 32).String(), "dev", "eth0")
	ipIn(t, o.path(), "link", "set", "eth0", "up")
	// The node forwards its pods' traffic: the CNI's and the host's
	// business, not kube-proxy's (which sets no such sysctl).
	if err := netns.Do(o.path(), func() error { return sysctl.Set("net.ipv4.ip_forward", "1") }); err != nil {
		t.Fatal(err)
	}
	// As the lab's nodes: the service CIDR on-link, so a ClusterIP without
	// endpoints is refused by the proxy rather than unroutable.
	ipIn(t, o.path(), "route", "add", s.ServiceCIDR.String(), "dev", "eth0")
	// The other CNI's routing: every lab node's pods via the node.
	for name, cidr := range l.podCIDRs(t) {
		n, ok := s.Node(name)
		if !ok {
			t.Fatalf("unknown node %s", name)
		}
		ipIn(t, o.path(), "route", "add", cidr.String(), "via", n.IP.String(), "dev", "eth0")
	}
	// And back: the lab nodes reach this node's pods via its address.
	for _, n := range s.Nodes {
		ipIn(t, lab.NetnsPath(n.Netns), "route", "add", otherPodSubnet, "via", o.ip.String(), "dev", "eth0")
		t.Cleanup(func() {
			_ = exec.Command("ip", "-n", n.Netns, "route", "del", otherPodSubnet, "via", o.ip.String()).Run()
		})
	}
	return o
}

// addPod makes the pod namespace and attaches it with the reference bridge
// plugin (host-local IPAM), run inside the node namespace as a container
// runtime would. It returns the pod's IP.
func (o *otherNode) addPod(t *testing.T, refDir string) {
	t.Helper()
	if _, err := netns.Create(o.podNetns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Delete(o.podNetns); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	ipIn(t, o.podPath(), "link", "set", "lo", "up")
	conf, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "othercni",
		"type":       "bridge",
		"bridge":     "cni0",
		"isGateway":  true,
		"ipMasq":     false, // the pod's own address reaches the lab's pods
		"ipam": map[string]any{
			"type":    "host-local",
			"ranges":  [][]map[string]string{{{"subnet": otherPodSubnet}}},
			"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
			"dataDir": t.TempDir(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(refDir, "bridge"))
	cmd.Stdin = bytes.NewReader(conf)
	cmd.Env = append(os.Environ(), "CNI_COMMAND=ADD", "CNI_CONTAINERID=proxyonly-"+randHex(4),
		"CNI_NETNS="+o.podPath(), "CNI_IFNAME=eth0", "CNI_PATH="+refDir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := netns.Do(o.path(), cmd.Run); err != nil {
		t.Fatalf("reference bridge ADD: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil || len(res.IPs) != 1 {
		t.Fatalf("reference bridge ADD result %s: %v", stdout.String(), err)
	}
	p, err := netip.ParsePrefix(res.IPs[0].Address)
	if err != nil || !netip.MustParsePrefix(otherPodSubnet).Contains(p.Addr()) {
		t.Fatalf("reference bridge gave the pod %q, not an address in %s (%v)", res.IPs[0].Address, otherPodSubnet, err)
	}
	o.podIP = p.Addr().String()
}

// daemon is a process the test started and stops by its PID.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // cmd.Wait's, once done is closed
}

// startIn starts argv inside the namespace at nsPath, logging to a file,
// and registers its stop (SIGTERM, then SIGKILL after 10 s).
func startIn(t *testing.T, name, nsPath string, argv ...string) *daemon {
	t.Helper()
	d := &daemon{name: name, log: filepath.Join(t.TempDir(), name+".log"), done: make(chan struct{})}
	logf, err := os.Create(d.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := netns.Do(nsPath, d.cmd.Start); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		if _, err := d.stop(10 * time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if t.Failed() {
			t.Logf("%s log (last 40 lines):\n%s", name, proc.Tail(d.log, 40))
		}
	})
	return d
}

// running reports whether the process has not exited.
func (d *daemon) running() bool {
	select {
	case <-d.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process by its PID and waits for it, killing
// it after grace; it returns how the process ended (nil: exit status 0).
func (d *daemon) stop(grace time.Duration) (exit error, err error) {
	if d.running() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(grace):
			_ = d.cmd.Process.Kill()
			<-d.done
			return d.err, fmt.Errorf("%s (pid %d) still running %s after SIGTERM; killed", d.name, d.cmd.Process.Pid, grace)
		}
	}
	return d.err, nil
}

const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
clusterCIDR: %s
mode: nftables
nftables:
  minSyncPeriod: 100ms
  syncPeriod: 30s
healthzBindAddress: %s:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [%s/32]
# Fields kube-proxy has that flatnet ignores or tolerates:
conntrack:
  maxPerCore: 0
detectLocalMode: ClusterCIDR
`

func TestProxyOnly(t *testing.T) {
	l := newLab(t)
	refDir := testutil.RefCNI(t, "main/bridge", "ipam/host-local")
	l.up(t, 2)
	s := l.spec

	o := newOtherNode(t, l)
	o.addPod(t, refDir)
	t.Logf("other node %s (netns %s), pod %s (netns %s) attached by the reference bridge plugin %s", o.ip, o.netns, o.podIP, o.podNetns, testutil.RefCNIVersion)

	// The pod runs the lab's netexec, as lab pods do (the lab puts its own
	// flatnet on the pods' PATH; here it is the freshly built one).
	startIn(t, "netexec", o.podPath(), l.flatnet, "netexec", "--http-port=8080", "--udp-port=8081")
	if err := retry(30*time.Second, func() error {
		_, err := httpGet(o.path(), net.JoinHostPort(o.podIP, "8080"), "/healthz")
		return err
	}); err != nil {
		t.Fatalf("the reference-CNI pod's netexec does not answer from its node: %v", err)
	}

	cfg := filepath.Join(t.TempDir(), "kube-proxy.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, kubeProxyConfig, s.Kubeconfig(), o.name, otherClusterCIDR, o.ip, o.ip), 0o644); err != nil {
		t.Fatal(err)
	}
	agent := startIn(t, "agent", o.path(), l.flatnet, "agent", "--proxy-only", "--config", cfg, "-v=2")

	// Endpoints: a netexec pod on each lab node.
	label := "po-" + randHex(3)
	sel := map[string]string{"e2e-service": label}
	var backends []string
	for _, n := range s.Nodes {
		p := netexecPod(label+"-"+strconv.Itoa(n.Index), n.Name)
		p.Labels = sel
		l.create(t, p)
		backends = append(backends, p.Name)
	}
	t.Cleanup(func() { l.deleteAndWait(t, backends...) })
	for _, b := range backends {
		l.waitReady(t, b)
	}
	web := l.createService(t, service(label+"-web", corev1.ServiceTypeClusterIP, sel))
	empty := l.createService(t, service(label+"-none", corev1.ServiceTypeClusterIP, map[string]string{"e2e-service": label + "-nothing"}))
	np := l.createService(t, service(label+"-np", corev1.ServiceTypeNodePort, sel))
	vip := web.Spec.ClusterIP
	t.Logf("services: %s %s (%v), %s %s, %s nodePort %d", web.Name, vip, backends, empty.Name, empty.Spec.ClusterIP, np.Name, np.Spec.Ports[0].NodePort)
	pod := labPod{name: "reference-cni-pod", ip: o.podIP, node: lab.Node{Name: o.name, Netns: o.netns, IP: o.ip}}

	t.Run("ClusterIPFromReferenceCNIPodReachesEveryEndpoint", func(t *testing.T) {
		seen := map[string]int{}
		var last string
		err := retry(30*time.Second, func() error {
			answers, errs, err := dialAll(pod, vip, 80, 20)
			if err != nil {
				return err
			}
			for _, a := range answers {
				seen[strings.TrimSpace(a)]++
			}
			last = fmt.Sprintf("answers %q, errors %q", answers, errs)
			for _, b := range backends {
				if seen[b] == 0 {
					return fmt.Errorf("%s not seen yet", b)
				}
			}
			return nil
		})
		if err != nil {
			t.Errorf("pod %s -> %s:80: %v (seen %v; last round %s)", o.podIP, vip, err, keys(seen), last)
		}
	})

	t.Run("ClientAddressIsThePod", func(t *testing.T) {
		// No masquerade of ClusterIP traffic from a pod: the endpoint sees
		// the pod's own address and answers over the route back.
		for range 5 {
			var got string
			err := retry(30*time.Second, func() error {
				var err error
				got, err = dial(o.path(), o.podIP, vip, 80, "clientip")
				return err
			})
			if err != nil || hostOf(got) != o.podIP {
				t.Fatalf("pod %s -> %s:80 /clientip: %q (%v), want the pod's address", o.podIP, vip, got, err)
			}
		}
	})

	t.Run("ClusterIPFromTheNode", func(t *testing.T) {
		err := retry(30*time.Second, func() error {
			body, err := httpGet(o.path(), net.JoinHostPort(vip, "80"), "/hostname")
			if err == nil && !contains(backends, strings.TrimSpace(body)) {
				err = fmt.Errorf("answered by %q, not an endpoint", body)
			}
			return err
		})
		if err != nil {
			t.Errorf("node %s -> %s:80: %v", o.ip, vip, err)
		}
	})

	t.Run("NoEndpointsRefusedAtOnce", func(t *testing.T) {
		checkRefused(t, pod, "pod", empty.Spec.ClusterIP, 80)
	})

	t.Run("NodePortOnTheNodeFromALabNode", func(t *testing.T) {
		addr := net.JoinHostPort(o.ip.String(), strconv.Itoa(int(np.Spec.Ports[0].NodePort)))
		for _, from := range s.Nodes {
			if _, err := answeredByEndpoint(from, addr, backends); err != nil {
				t.Errorf("lab node %s -> %s (NodePort): %v", from.Name, addr, err)
			}
		}
	})

	t.Run("NodePortOnlyOnNodePortAddresses", func(t *testing.T) {
		// The node's second address is outside nodePortAddresses: nothing
		// listens there, so the kernel refuses the connection.
		second := nthAddr(s.Underlay, otherNodeHost2).String()
		addr := net.JoinHostPort(second, strconv.Itoa(int(np.Spec.Ports[0].NodePort)))
		for i := 0; i < 3; i++ {
			if body, err := httpGet(lab.NetnsPath(s.Nodes[0].Netns), addr, "/hostname"); err == nil {
				t.Fatalf("lab node %s -> %s (NodePort on an address outside nodePortAddresses): answered %q", s.Nodes[0].Name, addr, body)
			} else if !strings.Contains(err.Error(), "connection refused") {
				t.Fatalf("lab node %s -> %s: %v; want connection refused (the address is up, only the NodePort is not there)", s.Nodes[0].Name, addr, err)
			}
		}
	})

	t.Run("HealthAndMetrics", func(t *testing.T) {
		// healthzBindAddress is the node's address (a load balancer's
		// check comes from off the node), metricsBindAddress loopback.
		var body string
		err := retry(30*time.Second, func() error {
			var err error
			body, err = httpGet(lab.NetnsPath(s.Nodes[0].Netns), net.JoinHostPort(o.ip.String(), "10256"), "/healthz")
			return err
		})
		var st struct {
			NodeName    string `json:"nodeName"`
			NodeHealthy *bool  `json:"nodeHealthy"`
		}
		if err != nil || json.Unmarshal([]byte(body), &st) != nil || st.NodeName != o.name || st.NodeHealthy == nil || !*st.NodeHealthy {
			t.Errorf("/healthz on %s:10256 from lab node %s: %q (%v); want 200 with nodeName %s, nodeHealthy true", o.ip, s.Nodes[0].Name, body, err, o.name)
		}
		if _, err := httpGet(o.path(), net.JoinHostPort(o.ip.String(), "10256"), "/livez"); err != nil {
			t.Errorf("/livez: %v", err)
		}
		metrics, err := httpGet(o.path(), "127.0.0.1:10249", "/metrics")
		if err != nil || !strings.Contains(metrics, "flatnet_sync_proxy_rules_duration_seconds") {
			t.Errorf("/metrics on 127.0.0.1:10249 in the node: %v; want flatnet_sync_proxy_rules_duration_seconds in:\n%.2000s", err, metrics)
		}
	})

	t.Run("OnlyTheProxy", func(t *testing.T) {
		// --proxy-only programs the proxy's tables and nothing else: no
		// masquerade table, no flatnet routes (proto 0x66), no overlay
		// device, no conflist.
		tables := strings.TrimSpace(testutil.RunIn(t, o.path(), "nft", "list", "tables"))
		for _, line := range strings.Split(tables, "\n") {
			if line != "" && !strings.HasSuffix(line, " flatnet-proxy") {
				t.Errorf("nft table %q in the node besides the proxy's:\n%s", line, tables)
			}
		}
		if !strings.Contains(tables, "table ip flatnet-proxy") {
			t.Errorf("no table ip flatnet-proxy in the node:\n%s", tables)
		}
		if out := strings.TrimSpace(ipIn(t, o.path(), "route", "show", "proto", "0x66")); out != "" {
			t.Errorf("flatnet routes in the node:\n%s", out)
		}
		if out := ipIn(t, o.path(), "-o", "link", "show"); strings.Contains(out, "flatnet") {
			t.Errorf("a flatnet device in the node:\n%s", out)
		}
	})

	t.Run("StopsOnSIGTERM", func(t *testing.T) {
		if !agent.running() {
			t.Fatalf("the agent exited early: %v", agent.err)
		}
		exit, err := agent.stop(10 * time.Second)
		if err != nil || exit != nil {
			t.Errorf("agent stop: %v, exit %v; want exit status 0", err, exit)
		}
	})
}
