package portmap

// Root tests: three namespaces the test creates stand in for a node and
// its neighbours, joined by veth pairs the test makes (the part bridge or
// ptp would do):
//
//	out (client) 10.231.2.2 / fd00:231:2::2
//	   | eth0 <-> fnpo*
//	host (node)  10.231.2.1 (+ 10.231.2.3) / fd00:231:2::1, and 10.231.1.1 / fd00:231:1::1
//	   | fnpc* <-> eth0
//	ctr (pod)    10.231.1.2 / fd00:231:1::2: TCP echo on :80, UDP echo on :5353
//
// The plugin runs as the flatnet-cni binary through libcni from inside the
// host namespace, with the pod's veth in its prevResult, so every nft and
// iptables command it runs acts on the host namespace only. Traffic is real:
// a client in "out" connects to the host's address and must reach the pod.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/veth/vethtest"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

const (
	hostOut    = "10.231.2.1"
	hostOut2   = "10.231.2.3"
	outIP      = "10.231.2.2"
	hostCtr    = "10.231.1.1"
	ctrIP      = "10.231.1.2"
	hostOut6   = "fd00:231:2::1"
	outIP6     = "fd00:231:2::2"
	hostCtr6   = "fd00:231:1::1"
	ctrIP6     = "fd00:231:1::2"
	testRange  = "10.231.0.0/16"
	testRange6 = "fd00:231::/32"
)

// rootLab is a vethtest.Lab (its host namespace is the node) with the
// pod and client namespaces wired to it.
type rootLab struct {
	*vethtest.Lab
	t        testing.TB
	ctr, out string
	hostVeth string
	network  string
	backend  string
	cniPath  string
	prev     *current.Result
}

// vethTo wires peer's eth0 to hostName in the host namespace, with the
// given addresses, and a default route in peer via gw and gw6.
func (l *rootLab) vethTo(peer, hostName string, hostAddrs, peerAddrs []string, gw, gw6 string) {
	l.t.Helper()
	testutil.Wire(l.t, l.Host, hostName, hostAddrs, peer, "eth0", peerAddrs)
	testutil.Run(l.t, "ip", "-n", testutil.NSName(peer), "route", "add", "default", "via", gw)
	testutil.Run(l.t, "ip", "-n", testutil.NSName(peer), "-6", "route", "add", "default", "via", gw6)
}

// ipnet parses "ip/len" keeping the address.
func ipnet(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return *n
}

func newRootLab(t testing.TB, backend string) *rootLab {
	t.Helper()
	requireTools(t)
	testutil.RequireFreeRange(t, testRange, testRange6)
	l := &rootLab{Lab: vethtest.New(t, ""), t: t, ctr: testutil.NewNetNS(t), out: testutil.NewNetNS(t),
		hostVeth: testutil.Name("fnpc"), network: testutil.Name("fnpm-"), backend: backend, cniPath: testutil.CNIPath(t)}
	if err := l.InHost(func() error {
		if err := sysctl.Set("net.ipv4.ip_forward", "1"); err != nil {
			return err
		}
		return sysctl.Set("net.ipv6.conf.all.forwarding", "1")
	}); err != nil {
		t.Fatal(err)
	}
	l.vethTo(l.ctr, l.hostVeth, []string{hostCtr + "/24", hostCtr6 + "/64"}, []string{ctrIP + "/24", ctrIP6 + "/64"}, hostCtr, hostCtr6)
	l.vethTo(l.out, testutil.Name("fnpo"), []string{hostOut + "/24", hostOut2 + "/24", hostOut6 + "/64"},
		[]string{outIP + "/24", outIP6 + "/64"}, hostOut, hostOut6)

	testutil.EchoServer(t, l.ctr, ":80", "ctr")
	udpEcho(t, l.ctr, ":5353", "ctr-udp")

	l.prev = &current.Result{
		CNIVersion: "1.1.0",
		Interfaces: []*current.Interface{{Name: l.hostVeth}, {Name: "eth0", Sandbox: l.ctr}},
		IPs: []*current.IPConfig{
			{Interface: current.Int(1), Address: ipnet(ctrIP + "/24")},
			{Interface: current.Int(1), Address: ipnet(ctrIP6 + "/64")},
		},
	}
	return l
}

// requireTools skips t (fails it in CI) unless root and both backends'
// tools are there.
func requireTools(t testing.TB) {
	t.Helper()
	testutil.RequireRoot(t)
	for _, tool := range []string{"nft", "iptables-save", "iptables-restore", "ip6tables-save", "ip6tables-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			testutil.Skip(t, "%s is not installed; run hack/deps.sh", tool)
		}
	}
}

// udpEcho answers each datagram on addr inside ns with
// "<prefix> <client ip>".
func udpEcho(t testing.TB, ns, addr, prefix string) {
	t.Helper()
	var pc net.PacketConn
	if err := netns.Do(ns, func() error {
		var err error
		pc, err = net.ListenPacket("udp", addr)
		return err
	}); err != nil {
		t.Fatalf("udp listen in %s: %v", ns, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(from.String())
			_, _ = pc.WriteTo([]byte(prefix+" "+host), from)
		}
	}()
}

// udpAsk sends a datagram to addr from ns (from local port lport if not 0)
// and returns the answer.
func udpAsk(ns, addr string, lport int) (string, error) {
	var c *net.UDPConn
	err := netns.Do(ns, func() error {
		raddr, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return err
		}
		var laddr *net.UDPAddr
		if lport != 0 {
			laddr = &net.UDPAddr{Port: lport}
		}
		c, err = net.DialUDP("udp", laddr, raddr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 1500)
	for range 3 { // datagrams may be lost; a reply must come within 3 tries
		if _, err := c.Write([]byte("hi")); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(700 * time.Millisecond))
		n, err := c.Read(buf)
		if err == nil {
			return string(buf[:n]), nil
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return "", err
		}
	}
	return "", fmt.Errorf("no UDP answer from %s", addr)
}

func (l *rootLab) list(extra map[string]any) *libcni.NetworkConfigList {
	l.t.Helper()
	plug := map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}, "prevResult": l.prev}
	if l.backend != "" {
		plug["backend"] = l.backend
	}
	for k, v := range extra {
		plug[k] = v
	}
	return vethtest.ConfList(l.t, l.network, plug)
}

type pm struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

func rt(id string, ns string, maps ...pm) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: ns, IfName: "eth0", CapabilityArgs: map[string]any{"portMappings": maps}}
}

func (l *rootLab) sh(argv ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", testutil.NSName(l.Host)}, argv...)...).CombinedOutput()
	return string(out), err
}

// ruleset returns our rules in the host namespace, as text.
func (l *rootLab) ruleset() string {
	l.t.Helper()
	var b strings.Builder
	if out, err := l.sh("nft", "list", "table", "inet", nftTable); err == nil {
		b.WriteString(out)
	}
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		out, err := l.sh(tool, "-t", "nat")
		if err != nil {
			l.t.Fatalf("%s: %v\n%s", tool, err, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "FLATNET") {
				b.WriteString(tool + ": " + line + "\n")
			}
		}
	}
	return b.String()
}

// attachmentRules returns the lines of a ruleset() that belong to an
// attachment (not to the shared skeleton that DEL leaves for the next ADD).
func attachmentRules(rs string) string {
	var out []string
	for _, line := range strings.Split(rs, "\n") {
		if strings.Contains(line, nftChainPrefix) || strings.Contains(line, iptChainPrefix) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

func (l *rootLab) wantAnswer(from, addr, want string) {
	l.t.Helper()
	got, err := testutil.Ask(from, addr)
	if err != nil || got != want {
		l.t.Fatalf("TCP %s from %s: got %q, %v; want %q\nrules:\n%s", addr, testutil.NSName(from), got, err, want, l.ruleset())
	}
}

func (l *rootLab) wantNoAnswer(from, addr string) {
	l.t.Helper()
	if got, err := testutil.Ask(from, addr); err == nil {
		l.t.Fatalf("TCP %s from %s answered %q, want no connection", addr, testutil.NSName(from), got)
	}
}

func (l *rootLab) wantUDP(from, addr string, lport int, want string) {
	l.t.Helper()
	got, err := udpAsk(from, addr, lport)
	if err != nil || got != want {
		l.t.Fatalf("UDP %s from %s: got %q, %v; want %q\nrules:\n%s", addr, testutil.NSName(from), got, err, want, l.ruleset())
	}
}

func TestRootPortmap(t *testing.T) {
	for _, backend := range []string{"nftables", "iptables"} {
		t.Run(backend, func(t *testing.T) { testRootPortmap(t, backend) })
	}
}

func testRootPortmap(t *testing.T, backend string) {
	l := newRootLab(t, backend)
	pl := l.WithList(l.list(nil))
	maps := []pm{
		{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"},
		{HostPort: 5353, ContainerPort: 5353, Protocol: "udp"},
		{HostPort: 8081, ContainerPort: 80, Protocol: "tcp", HostIP: hostOut},
	}
	r := rt("ctr1", l.ctr, maps...)

	// A conntrack user in the host namespace (ours, removed with it), so
	// that a UDP flow sent before ADD leaves a conntrack entry behind.
	if out, err := l.sh("nft", "add table inet fntest-ct; add chain inet fntest-ct in { type filter hook input priority 0 ; }; add rule inet fntest-ct in ct state new counter"); err != nil {
		t.Fatalf("conntrack user: %v\n%s", err, out)
	}
	_, _ = udpAsk(l.out, net.JoinHostPort(hostOut, "5353"), 40053) // no listener on the host: no answer

	res, err := pl.AddRaw(r)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	got, err := current.GetResult(res)
	if err != nil || len(got.IPs) != 2 || got.IPs[0].Address.IP.String() != ctrIP {
		t.Fatalf("ADD result %+v, %v: want prevResult passed through", res, err)
	}

	// From outside: TCP and UDP, IPv4 and IPv6, client address kept.
	l.wantAnswer(l.out, net.JoinHostPort(hostOut, "8080"), "ctr "+outIP)
	l.wantAnswer(l.out, net.JoinHostPort(hostOut6, "8080"), "ctr "+outIP6)
	l.wantUDP(l.out, net.JoinHostPort(hostOut, "5353"), 0, "ctr-udp "+outIP)
	l.wantUDP(l.out, net.JoinHostPort(hostOut6, "5353"), 0, "ctr-udp "+outIP6)
	// The flow sent before ADD, same source port: its stale conntrack
	// entry was deleted, so it is forwarded now.
	l.wantUDP(l.out, net.JoinHostPort(hostOut, "5353"), 40053, "ctr-udp "+outIP)

	// From the host itself: its own address, and 127.0.0.1 (masqueraded
	// to the address facing the pod, through route_localnet).
	l.wantAnswer(l.Host, net.JoinHostPort(hostOut, "8080"), "ctr "+hostOut)
	l.wantAnswer(l.Host, "127.0.0.1:8080", "ctr "+hostCtr)
	if err := l.InHost(func() error {
		v, err := sysctl.Get("net.ipv4.conf." + l.hostVeth + ".route_localnet")
		if err == nil && v != "1" {
			err = fmt.Errorf("route_localnet on %s is %s", l.hostVeth, v)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Hairpin: the pod reaches itself through the host port, masqueraded.
	l.wantAnswer(l.ctr, net.JoinHostPort(hostOut, "8080"), "ctr "+hostCtr)
	l.wantAnswer(l.ctr, net.JoinHostPort(hostOut6, "8080"), "ctr "+hostCtr6)

	// hostIP restricts: 8081 answers on 10.231.2.1 only, not on the
	// host's other address nor on IPv6.
	l.wantAnswer(l.out, net.JoinHostPort(hostOut, "8081"), "ctr "+outIP)
	l.wantNoAnswer(l.out, net.JoinHostPort(hostOut2, "8081"))
	l.wantNoAnswer(l.out, net.JoinHostPort(hostOut6, "8081"))
	l.wantAnswer(l.out, net.JoinHostPort(hostOut2, "8080"), "ctr "+outIP)

	if err := pl.CheckRT(r); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := pl.Status(); err != nil {
		t.Fatalf("STATUS: %v", err)
	}

	// ADD is idempotent on the real kernel too.
	before := l.ruleset()
	if _, err := pl.AddRaw(r); err != nil {
		t.Fatalf("second ADD: %v", err)
	}
	if after := l.ruleset(); after != before {
		t.Fatalf("second ADD changed the ruleset:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// Nothing in the other backend.
	if backend == "nftables" && strings.Contains(before, "iptables-save") || backend == "iptables" && strings.Contains(before, "table inet") {
		t.Fatalf("%s backend wrote into the other backend:\n%s", backend, before)
	}

	// Tampering makes CHECK fail with 106.
	id := attachmentID(l.network, "ctr1", "eth0")
	var tamper []string
	if backend == "nftables" {
		tamper = []string{"nft", "flush", "chain", "inet", nftTable, nftChain(id)}
	} else {
		tamper = []string{"iptables", "-t", "nat", "-F", iptChain(id)}
	}
	if out, err := l.sh(tamper...); err != nil {
		t.Fatalf("%v: %v\n%s", tamper, err, out)
	}
	err = pl.CheckRT(r)
	if vethtest.Code(err) != cnierr.CheckFailed {
		t.Fatalf("CHECK after tampering: %v, want code 106", err)
	}
	l.wantNoAnswer(l.out, net.JoinHostPort(hostOut, "8080"))

	// DEL: the attachment's rules go, ports stop answering; DEL twice is
	// fine.
	if err := pl.DelRT(r); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if rs := l.ruleset(); attachmentRules(rs) != "" {
		t.Fatalf("attachment rules left after DEL:\n%s", rs)
	}
	l.wantNoAnswer(l.out, net.JoinHostPort(hostOut, "8080"))
	l.wantNoAnswer(l.Host, "127.0.0.1:8080")
	if _, err := udpAsk(l.out, net.JoinHostPort(hostOut, "5353"), 0); err == nil {
		t.Fatal("UDP still answered after DEL")
	}
	if err := pl.DelRT(r); err != nil {
		t.Fatalf("second DEL: %v", err)
	}
}

func TestRootGC(t *testing.T) {
	for _, backend := range []string{"nftables", "iptables"} {
		t.Run(backend, func(t *testing.T) { testRootGC(t, backend) })
	}
}

func testRootGC(t *testing.T, backend string) {
	l := newRootLab(t, backend)
	keep := rt("keep", l.ctr, pm{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	stale := rt("stale", l.ctr, pm{HostPort: 9090, ContainerPort: 80, Protocol: "tcp"})
	// Separate caches: libcni must not know "stale", or its GC would
	// send a DEL for it and the plugin's own GC would not be tested.
	labKeep := l.WithList(l.list(nil)).WithCache()
	labStale := l.WithList(l.list(nil)).WithCache()
	for _, c := range []struct {
		lab *vethtest.Lab
		rt  *libcni.RuntimeConf
	}{{labKeep, keep}, {labStale, stale}} {
		if _, err := c.lab.AddRaw(c.rt); err != nil {
			t.Fatalf("ADD %s: %v", c.rt.ContainerID, err)
		}
	}
	l.wantAnswer(l.out, net.JoinHostPort(hostOut, "9090"), "ctr "+outIP)

	if err := labKeep.GC("keep"); err != nil {
		t.Fatalf("GC: %v", err)
	}
	l.wantNoAnswer(l.out, net.JoinHostPort(hostOut, "9090"))
	l.wantAnswer(l.out, net.JoinHostPort(hostOut, "8080"), "ctr "+outIP)
	rs := l.ruleset()
	staleID, keepID := attachmentID(l.network, "stale", "eth0"), attachmentID(l.network, "keep", "eth0")
	if strings.Contains(strings.ToLower(rs), staleID.String()) || !strings.Contains(strings.ToLower(rs), keepID.String()) {
		t.Fatalf("after GC (stale %s, keep %s):\n%s", staleID, keepID, rs)
	}
	// GC with nothing valid leaves no rule at all.
	if err := labKeep.GCArgs(&libcni.GCArgs{}); err != nil {
		t.Fatalf("GC all: %v", err)
	}
	if rs := l.ruleset(); rs != "" {
		t.Fatalf("rules left after GC of everything:\n%s", rs)
	}
}

// TestRootNoNFTBinary runs the binary with a PATH that has neither nft
// nor the iptables tools: with no backend configured it programs nftables
// over netlink (the nft binary is not needed), traffic flows, and STATUS
// and DEL work without it.
func TestRootNoNFTBinary(t *testing.T) {
	l := newRootLab(t, "")
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := map[string]any{"cniVersion": "1.1.0", "name": l.network, "type": "portmap", "prevResult": l.prev,
		"runtimeConfig": map[string]any{"portMappings": []pm{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}}}}
	stdin, _ := json.Marshal(conf)
	run := func(cmd string) (string, string) {
		var stdout, stderr strings.Builder
		err := l.InHost(func() error {
			c := exec.Command(filepath.Join(l.cniPath, "portmap"))
			c.Env = []string{"PATH=" + bin, "CNI_COMMAND=" + cmd, "CNI_CONTAINERID=ctr1", "CNI_NETNS=" + l.ctr,
				"CNI_IFNAME=eth0", "CNI_PATH=" + l.cniPath}
			c.Stdin, c.Stdout, c.Stderr = strings.NewReader(string(stdin)), &stdout, &stderr
			return c.Run()
		})
		if err != nil {
			t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", cmd, err, stdout.String(), stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	if _, stderr := run("ADD"); strings.Contains(stderr, "falling back") {
		t.Errorf("ADD fell back to iptables: %s", stderr)
	}
	rs := l.ruleset()
	if !strings.Contains(rs, "table inet "+nftTable) || !strings.Contains(rs, nftChainPrefix) || strings.Contains(rs, "iptables-save: -A FLATNET-DN-") {
		t.Fatalf("ruleset after ADD:\n%s", rs)
	}
	l.wantAnswer(l.out, net.JoinHostPort(hostOut, "8080"), "ctr "+outIP)
	run("STATUS")
	run("DEL")
	if rs := l.ruleset(); attachmentRules(rs) != "" || !strings.Contains(rs, "table inet "+nftTable) {
		t.Fatalf("after DEL, want only the shared chains:\n%s", rs)
	}
}
