package e2e

// The overlay end to end: one lab of 3 nodes on two underlay subnets
// (nodes 1 and 3 on the first, node 2 behind the router on the second)
// with an external host, run first with the vxlan backend and then, after
// `up --backend vxlan-direct` restarts the agents, with vxlan-direct. In
// each: pod to pod across nodes and subnets with the client's own address,
// the routes, neighbour and FDB entries each node holds, the MTU (a
// full-size packet with DF set crosses, one byte more is refused with
// ICMP "fragmentation needed"), and egress to the external host from the
// node's address. Then a node is removed and its entries go from every
// peer, and `down` leaves nothing.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/netexec"
	"github.com/flatnet/flatnet/internal/testutil"
)

// labPod is a netexec pod of a test.
type labPod struct {
	name, ip string
	node     lab.Node
}

// netexecPods starts one netexec pod per node, named prefix-<node index>,
// and waits until they are Ready.
func (l *testLab) netexecPods(t *testing.T, prefix string) []labPod {
	t.Helper()
	for _, n := range l.spec.Nodes {
		l.create(t, netexecPod(prefix+"-"+strconv.Itoa(n.Index), n.Name))
	}
	var pods []labPod
	for _, n := range l.spec.Nodes {
		p := l.waitReady(t, prefix+"-"+strconv.Itoa(n.Index))
		pods = append(pods, labPod{p.Name, p.Status.PodIP, n})
	}
	return pods
}

// podCIDRs maps node name to its podCIDR.
func (l *testLab) podCIDRs(t *testing.T) map[string]netip.Prefix {
	t.Helper()
	nodes, err := l.c.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]netip.Prefix{}
	for _, n := range nodes.Items {
		if p, err := netip.ParsePrefix(n.Spec.PodCIDR); err == nil {
			out[n.Name] = p
		}
	}
	return out
}

// waitBackend waits until every node's agent says (in its Node's
// annotations) that it runs backend b, with a VTEP MAC for the vxlan
// backends: from then on its peers can program it.
func (l *testLab) waitBackend(t *testing.T, b string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		nodes, err := l.c.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		var missing []string
		if err != nil {
			missing = append(missing, err.Error())
		} else {
			for _, n := range nodes.Items {
				a := n.Annotations
				if a[backend.AnnotationBackend] != b || (b != backend.HostGW && a[backend.AnnotationVTEPMAC] == "") {
					missing = append(missing, fmt.Sprintf("%s: %s=%q %s=%q", n.Name, backend.AnnotationBackend, a[backend.AnnotationBackend],
						backend.AnnotationVTEPMAC, a[backend.AnnotationVTEPMAC]))
				}
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes not on backend %s after 60s: %s", b, strings.Join(missing, "; "))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkPodToPod has every pod ask every other pod for its hostname and for
// the client address it saw: the answer must name the right pod and the
// asking pod's own IP (no NAT between pods). A new path may take a moment
// (peers program it when they see the node's annotations).
func checkPodToPod(t *testing.T, pods []labPod) {
	t.Helper()
	for _, a := range pods {
		for _, b := range pods {
			if a.name == b.name {
				continue
			}
			var got string
			err := retry(30*time.Second, func() error {
				var err error
				if got, err = dial(lab.NetnsPath(a.node.Netns), a.ip, b.ip, 8080, "hostname"); err == nil && got != b.name {
					err = fmt.Errorf("answered by %q", got)
				}
				return err
			})
			if err != nil {
				t.Errorf("%s (%s) -> %s (%s, %s): %v", a.name, a.node.IP, b.name, b.ip, b.node.IP, err)
				continue
			}
			got, err = dial(lab.NetnsPath(a.node.Netns), a.ip, b.ip, 8080, "clientip")
			if err != nil || hostOf(got) != a.ip {
				t.Errorf("%s -> %s: clientip %q (%v), want the client pod's IP %s", a.name, b.name, got, err, a.ip)
			}
		}
	}
}

// checkEgress has every pod ask the external host who connected: the
// node's InternalIP (masqueraded), never the pod's IP.
func checkEgress(t *testing.T, s *lab.Spec, pods []labPod) {
	t.Helper()
	ext := s.External.IP.String()
	for _, p := range pods {
		var got string
		err := retry(30*time.Second, func() error {
			var err error
			got, err = dial(lab.NetnsPath(p.node.Netns), p.ip, ext, lab.ExternalHTTPPort, "clientip")
			return err
		})
		if err != nil || hostOf(got) != p.node.IP.String() {
			t.Errorf("pod %s on %s -> external host %s: it saw %q (%v), want the node's address %s", p.name, p.node.Name, ext, got, err, p.node.IP)
		}
	}
}

// dfProbe runs `flatnet netexec df-probe` inside pod: one UDP packet of
// size bytes with DF set to to (a netexec UDP server).
func (l *testLab) dfProbe(t *testing.T, pod string, to netip.AddrPort, size int) netexec.ProbeResult {
	t.Helper()
	out, err := l.cli("exec", pod, "--", "flatnet", "netexec", "df-probe", "--to", to.String(), "--size", strconv.Itoa(size))
	var res netexec.ProbeResult
	// The result is the last JSON line (kubectl exec, on real nodes, adds
	// "command terminated with exit code N" after it).
	line := ""
	for _, l := range nonEmptyLines(out) {
		if strings.HasPrefix(l, "{") {
			line = l
		}
	}
	if jerr := json.Unmarshal([]byte(line), &res); jerr != nil {
		t.Fatalf("df-probe in %s to %s, %d bytes: %v (%v)\n%s", pod, to, size, jerr, err, out)
	}
	return res
}

// podMTU reads the MTU of eth0 inside pod.
func (l *testLab) podMTU(t *testing.T, pod string) int {
	t.Helper()
	out, err := l.cli("exec", pod, "--", "cat", "/sys/class/net/eth0/mtu")
	mtu, perr := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || perr != nil {
		t.Fatalf("eth0 MTU of %s: %q %v", pod, out, err)
	}
	return mtu
}

// conflistMTU is the mtu the node's CNI config gives its pods.
func conflistMTU(t *testing.T, s *lab.Spec, n lab.Node) int {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(s.CNIConfDir(n), "*.conflist"))
	if len(m) != 1 {
		t.Fatalf("conflists of %s: %v", n.Name, m)
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Plugins {
		if p["type"] == "bridge" || p["type"] == "flatnet" { // the classic chain's, or the flatnet type's
			if v, ok := p["mtu"].(float64); ok {
				return int(v)
			}
		}
	}
	t.Fatalf("no bridge mtu in %s:\n%s", m[0], b)
	return 0
}

// raisePodMTU sets the MTU of pod's eth0 and of its veth peer on the node
// to mtu: a pod that ignores the MTU its CNI config gives.
func raisePodMTU(t *testing.T, s *lab.Spec, n lab.Node, pod string, mtu int) {
	t.Helper()
	podNS := podNetns(t, s, n, "default", pod)
	link := strings.TrimSpace(runInNS(t, podNS, "ip", "-o", "link", "show", "eth0"))
	// "2: eth0@if7: <...>": the peer is interface 7 in the node.
	_, after, ok := strings.Cut(strings.Fields(link)[1], "@if")
	if !ok {
		t.Fatalf("eth0 of %s has no peer index: %s", pod, link)
	}
	peer := ""
	for _, line := range strings.Split(testutil.RunIn(t, lab.NetnsPath(n.Netns), "ip", "-o", "link"), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[0] == strings.TrimSuffix(after, ":")+":" {
			peer = strings.Split(strings.TrimSuffix(f[1], ":"), "@")[0]
		}
	}
	if peer == "" {
		t.Fatalf("no interface %s on %s for %s's eth0", after, n.Name, pod)
	}
	testutil.RunIn(t, lab.NetnsPath(n.Netns), "ip", "link", "set", "dev", peer, "mtu", strconv.Itoa(mtu))
	runInNS(t, podNS, "ip", "link", "set", "dev", "eth0", "mtu", strconv.Itoa(mtu))
}

// checkMTU: pods get the underlay MTU less the 50 bytes of VXLAN; a
// packet of exactly that size with DF set crosses the overlay from a pod
// on from's node to server (on another node, across the overlay); one byte
// more is refused by the pod's own eth0, and, from a pod whose interface
// was raised to the underlay's MTU, by its node with ICMP "fragmentation
// needed" naming the overlay's MTU.
func checkMTU(t *testing.T, l *testLab, client string, from lab.Node, server labPod) {
	t.Helper()
	const underlayMTU = 1500 // the lab's veths
	want := underlayMTU - 50
	for _, n := range l.spec.Nodes {
		if got := conflistMTU(t, l.spec, n); got != want {
			t.Errorf("node %s: conflist mtu %d, want %d (underlay %d - 50)", n.Name, got, want, underlayMTU)
		}
	}
	if got := l.podMTU(t, client); got != want {
		t.Fatalf("pod %s: eth0 MTU %d, want %d", client, got, want)
	}
	to := netip.AddrPortFrom(netip.MustParseAddr(server.ip), 8081)
	if got := l.dfProbe(t, client, to, want); got.Result != netexec.ProbeDelivered {
		t.Errorf("%d bytes, DF, %s -> %s on %s: %+v; want delivered", want, client, server.name, server.node.Name, got)
	}
	if got := l.dfProbe(t, client, to, want+1); got.Result != netexec.ProbeLocalTooBig || got.MTU != want {
		t.Errorf("%d bytes, DF, from a pod with MTU %d: %+v; want refused by its own eth0", want+1, want, got)
	}
	raisePodMTU(t, l.spec, from, client, underlayMTU)
	defer raisePodMTU(t, l.spec, from, client, want)
	if got := l.dfProbe(t, client, to, want); got.Result != netexec.ProbeDelivered {
		t.Errorf("%d bytes, DF, from a pod with MTU %d: %+v; want delivered", want, underlayMTU, got)
	}
	got := l.dfProbe(t, client, to, want+1)
	if got.Result != netexec.ProbeFragNeeded || got.MTU != want || got.ICMPType != 3 || got.ICMPCode != 4 {
		t.Errorf("%d bytes, DF, from a pod with MTU %d: %+v; want ICMP frag-needed (3/4) with mtu %d", want+1, underlayMTU, got, want)
	}
	if addrs := testutil.RunIn(t, lab.NetnsPath(from.Netns), "ip", "-o", "-4", "addr"); got.From == "" || !strings.Contains(addrs, " "+got.From+"/") {
		t.Errorf("the ICMP came from %q, not from the client's node %s:\n%s", got.From, from.Name, addrs)
	}
	t.Logf("pod MTU %d: %d bytes with DF crossed; %d bytes: %s from %s (mtu %d)", want, want, want+1, got.Result, got.From, got.MTU)
}

// overlayEntries is what node n holds for peer p: its routes to p's
// podCIDR, the neighbour entries and the FDB entries on the VXLAN device
// for p's VTEP (MAC) and underlay address.
type overlayEntries struct {
	routes, neigh, fdb []string
}

func (e overlayEntries) empty() bool { return len(e.routes)+len(e.neigh)+len(e.fdb) == 0 }

func (e overlayEntries) String() string {
	return fmt.Sprintf("routes %q, neigh %q, fdb %q", e.routes, e.neigh, e.fdb)
}

func nonEmptyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// vtepMAC is the MAC of node n's VXLAN device ("" when it has none).
func vtepMAC(t *testing.T, n lab.Node) string {
	t.Helper()
	out, err := runIn(lab.NetnsPath(n.Netns), "cat", "/sys/class/net/"+vxlan.DeviceName+"/address")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

func entriesFor(t *testing.T, n lab.Node, peerCIDR netip.Prefix, peerIP netip.Addr, peerMAC string) overlayEntries {
	t.Helper()
	ns := lab.NetnsPath(n.Netns)
	var e overlayEntries
	e.routes = nonEmptyLines(testutil.RunIn(t, ns, "ip", "-4", "route", "show", "exact", peerCIDR.String()))
	if peerMAC == "" {
		return e
	}
	if out, err := runIn(ns, "ip", "-4", "neigh", "show", "dev", vxlan.DeviceName); err == nil {
		for _, l := range nonEmptyLines(out) {
			if strings.Contains(l, peerMAC) {
				e.neigh = append(e.neigh, l)
			}
		}
	}
	if out, err := runIn(ns, "bridge", "fdb", "show", "dev", vxlan.DeviceName); err == nil {
		for _, l := range nonEmptyLines(out) {
			if strings.Contains(l, peerMAC) || strings.Contains(l, "dst "+peerIP.String()+" ") {
				e.fdb = append(e.fdb, l)
			}
		}
	}
	return e
}

// checkPaths checks how node a reaches node b's pods under backend be:
// through the VXLAN device with one route, neighbour and FDB entry, or
// (vxlan-direct, same subnet) by a plain route via b's address and no
// VXLAN entry.
func checkPaths(t *testing.T, s *lab.Spec, be string, cidrs map[string]netip.Prefix) {
	t.Helper()
	for _, a := range s.Nodes {
		for _, b := range s.Nodes {
			if a.Name == b.Name {
				continue
			}
			mac := vtepMAC(t, b)
			if mac == "" {
				t.Fatalf("node %s has no %s device under %s", b.Name, vxlan.DeviceName, be)
			}
			e := entriesFor(t, a, cidrs[b.Name], b.IP, mac)
			direct := be == backend.VXLANDirect && a.Subnet == b.Subnet
			switch {
			case direct:
				if len(e.routes) != 1 || !strings.Contains(e.routes[0], "via "+b.IP.String()+" dev eth0") || len(e.neigh)+len(e.fdb) != 0 {
					t.Errorf("%s -> %s (same subnet, %s): want one route via %s dev eth0 and no VXLAN entry; got %s", a.Name, b.Name, be, b.IP, e)
				}
			default:
				if len(e.routes) != 1 || !strings.Contains(e.routes[0], "dev "+vxlan.DeviceName) || !strings.Contains(e.routes[0], "onlink") ||
					len(e.neigh) != 1 || len(e.fdb) != 1 || !strings.Contains(e.fdb[0], "dst "+b.IP.String()) {
					t.Errorf("%s -> %s (%s): want one route dev %s onlink, one neighbour and one FDB entry (dst %s); got %s", a.Name, b.Name, be, vxlan.DeviceName, b.IP, e)
				}
			}
		}
	}
}

func TestOverlay(t *testing.T) {
	l := newLab(t)
	before := snapshotHost(t, l.name, l.root)
	l.up(t, 3, "--subnets", "2", "--backend", backend.VXLAN, "--external")
	s := l.spec
	if s.Router == nil || s.External == nil || s.Nodes[1].Subnet != 1 || !s.Underlay2.Contains(s.Nodes[1].IP) || s.Nodes[0].Subnet != 0 || s.Nodes[2].Subnet != 0 {
		t.Fatalf("layout: router %+v external %+v nodes %+v", s.Router, s.External, s.Nodes)
	}

	t.Run("Underlay", func(t *testing.T) {
		// Node 2 is behind the router: its only way to the first subnet
		// (and the apiserver) is the router; nothing routes elsewhere.
		n2 := lab.NetnsPath(s.Nodes[1].Netns)
		if got := testutil.RunIn(t, n2, "ip", "-4", "route", "show", "exact", s.Underlay.String()); !strings.Contains(got, "via "+s.Router.IP2.String()) {
			t.Errorf("node 2's route to %s: %q", s.Underlay, got)
		}
		for _, ns := range []string{s.Nodes[0].Netns, s.Nodes[1].Netns, s.Router.Netns, s.External.Netns} {
			if got := strings.TrimSpace(testutil.RunIn(t, lab.NetnsPath(ns), "ip", "-4", "route", "show", "default")); got != "" {
				t.Errorf("%s has a default route: %s", ns, got)
			}
		}
		if got := testutil.Run(t, "ip", "-4", "route", "show", "exact", s.Underlay2.String()); !strings.Contains(got, "via "+s.Router.IP.String()+" dev "+s.Bridge) {
			t.Errorf("the root namespace's route to the second subnet: %q", got)
		}
		// The apiserver sees node 2 (Ready, heartbeating) from across the router.
		out := l.mustCLI(t, "status")
		if !strings.Contains(out, "underlay 2:") || !strings.Contains(out, "(up)") {
			t.Errorf("status:\n%s", out)
		}
		// host-gw cannot reach across the router: refused, lab untouched.
		p0 := pidFiles(t, s)
		if out, err := l.cli("up", "--backend", backend.HostGW); err == nil || !strings.Contains(out, "vxlan or vxlan-direct") {
			t.Errorf("up --backend host-gw on two subnets: %v\n%s", err, out)
		}
		if p1 := pidFiles(t, s); p1 != p0 {
			t.Errorf("a refused up changed the processes:\n%s\n%s", p0, p1)
		}
	})

	var pods []labPod
	for _, be := range []string{backend.VXLAN, backend.VXLANDirect} {
		if be != backend.VXLAN {
			out := l.mustCLI(t, "up", "--backend", be)
			if n := strings.Count(out, agentRole(s)+", "+be+"; was "+backend.VXLAN+") ... done"); n != 3 {
				t.Errorf("up --backend %s restarted %d agents, want 3:\n%s", be, n, out)
			}
			if l.spec, _ = lab.LoadSpec(l.root, l.name); l.spec.Backend != be {
				t.Fatalf("lab.json has backend %s after up --backend %s", l.spec.Backend, be)
			}
			s = l.spec
		}
		l.waitBackend(t, be)
		if pods == nil {
			// The same pods serve both backends: both give pods MTU 1450.
			pods = l.netexecPods(t, "ov")
			l.create(t, sleepPod("mtu-client", s.Nodes[0].Name, "86403"))
			l.waitRunning(t, "mtu-client")
		}
		cidrs := l.podCIDRs(t)

		t.Run(be+"/PodToPod", func(t *testing.T) { checkPodToPod(t, pods) })
		t.Run(be+"/Paths", func(t *testing.T) { checkPaths(t, s, be, cidrs) })
		t.Run(be+"/MTU", func(t *testing.T) {
			// From node 1 to node 2: across the router, through VXLAN in
			// both backends.
			checkMTU(t, l, "mtu-client", s.Nodes[0], pods[1])
		})
		t.Run(be+"/Egress", func(t *testing.T) { checkEgress(t, s, pods) })
	}

	t.Run("NodeRemoval", func(t *testing.T) {
		// Node 2 (the second subnet: a VXLAN peer of both others) goes:
		// its agent stops and its Node is deleted. Every peer drops its
		// route, neighbour and FDB entry; the others keep talking.
		gone := s.Nodes[1]
		cidrs := l.podCIDRs(t)
		mac := vtepMAC(t, gone)
		peers := []lab.Node{s.Nodes[0], s.Nodes[2]}
		for _, p := range peers {
			if e := entriesFor(t, p, cidrs[gone.Name], gone.IP, mac); len(e.routes) != 1 || len(e.neigh) != 1 || len(e.fdb) != 1 {
				t.Fatalf("before: %s holds for %s: %s", p.Name, gone.Name, e)
			}
		}
		if err := stopAgent(s, gone); err != nil {
			t.Fatal(err)
		}
		if err := l.c.CoreV1().Nodes().Delete(context.Background(), gone.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, p := range peers {
			var e overlayEntries
			if err := retry(30*time.Second, func() error {
				if e = entriesFor(t, p, cidrs[gone.Name], gone.IP, mac); !e.empty() {
					return fmt.Errorf("still there")
				}
				return nil
			}); err != nil {
				t.Errorf("30s after node %s went, %s still holds %s", gone.Name, p.Name, e)
			}
		}
		checkPodToPod(t, []labPod{pods[0], pods[2]})
	})

	t.Run("DownLeavesNothing", func(t *testing.T) {
		out := l.takeDown(t)
		t.Logf("lab down:\n%s", out)
		if d := before.diff(snapshotHost(t, l.name, l.root)); d != "" {
			t.Errorf("lab down left things behind:\n%s", d)
		}
		for _, ns := range []string{s.Router.Netns, s.External.Netns} {
			if _, err := os.Stat(lab.NetnsPath(ns)); err == nil {
				t.Errorf("netns %s still exists", ns)
			}
		}
	})
}

// runIn runs argv inside the namespace at nsPath and returns its output
// and error (for commands that may fail, such as reading a device that
// is not there).
func runIn(nsPath string, argv ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", testutil.NSName(nsPath)}, argv...)...).CombinedOutput()
	return string(out), err
}
