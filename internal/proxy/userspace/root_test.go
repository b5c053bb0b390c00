package userspace

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootNodeNamespace runs the mode in a node namespace of its own,
// with a pod namespace as the client and another as the endpoint, each
// wired to the node with a default route to it: the pod reaches the
// ClusterIP (an address on the node's lo, added by the mode) and the
// NodePort, over TCP and UDP; an endpoint that never answers costs a
// connection one 250 ms connect timeout; a restarted backend removes the
// address of a service deleted meanwhile; Cleanup removes the rest, twice.
func TestRootNodeNamespace(t *testing.T) {
	const (
		nodePodSide = "10.246.111.1"
		podAddr     = "10.246.111.2"
		nodeEpSide  = "10.246.112.1"
		epAddr      = "10.246.112.2"
		clusterIP   = "10.246.113.10"
		goneIP      = "10.246.113.20"
		nodePort    = 30080
	)
	testutil.RequireFreeRange(t, "10.246.111.0/24", "10.246.112.0/24", "10.246.113.0/24")
	node, pod, epNS := testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
	testutil.Wire(t, node, testutil.Name("fun"), []string{nodePodSide + "/24"}, pod, testutil.Name("fup"), []string{podAddr + "/24"})
	testutil.Wire(t, node, testutil.Name("fun"), []string{nodeEpSide + "/24"}, epNS, testutil.Name("fue"), []string{epAddr + "/24"})
	testutil.RunIn(t, pod, "ip", "route", "add", "default", "via", nodePodSide)
	testutil.RunIn(t, epNS, "ip", "route", "add", "default", "via", nodeEpSide)

	_, portStr, _ := net.SplitHostPort(testutil.EchoServer(t, epNS, epAddr+":0", "ep"))
	port, _ := strconv.Atoi(portStr)
	udpPort := udpEchoIn(t, epNS, epAddr)
	web := service("web", clusterIP, proxy.TCP, 8080, proxy.Endpoint{IP: netip.MustParseAddr(epAddr), Port: uint16(port), Ready: true})
	web.Type = proxy.NodePort
	web.Ports[0].NodePort = nodePort
	web.Ports = append(web.Ports, proxy.ServicePort{Name: "dns", Protocol: proxy.UDP, Port: 5353,
		Endpoints: []proxy.Endpoint{{IP: netip.MustParseAddr(epAddr), Port: udpPort, Ready: true}}})
	gone := service("gone", goneIP, proxy.TCP, 8080, web.Ports[0].Endpoints...)

	ctx := context.Background()
	first := New(Config{NetNS: node, NodeName: "n1"})
	t.Cleanup(first.Close)
	if res, err := first.Sync(ctx, []*proxy.Service{web, gone}, nil, true); err != nil || len(res.Conflicts) > 0 {
		t.Fatalf("sync: %v %v", err, res.Conflicts)
	}
	lo := testutil.RunIn(t, node, "ip", "-o", "addr", "show", "dev", "lo")
	for _, a := range []string{clusterIP, goneIP} {
		if !strings.Contains(lo, a+"/32 scope host lo:flatnetsvc") {
			t.Errorf("lo lacks %s/32 with the mode's label:\n%s", a, lo)
		}
	}
	// The endpoint sees the node's address: the userspace mode cannot
	// keep the client's.
	for _, to := range []string{clusterIP + ":8080", fmt.Sprintf("%s:%d", nodePodSide, nodePort)} {
		if got, err := testutil.Ask(pod, to); err != nil || got != "ep "+nodeEpSide {
			t.Errorf("pod -> %s: %q, %v; want %q", to, got, err, "ep "+nodeEpSide)
		}
	}
	if got, err := udpAskIn(pod, clusterIP+":5353"); err != nil || got != "udp" {
		t.Errorf("pod -> UDP %s:5353: %q, %v", clusterIP, got, err)
	}
	// An endpoint that never answers (no host has its address, ARP
	// fails): its connect attempt times out (250 ms) and the next
	// endpoint serves the client.
	silent := service("silent", "10.246.113.30", proxy.TCP, 8080,
		proxy.Endpoint{IP: netip.MustParseAddr("10.246.112.99"), Port: uint16(port), Ready: true}, web.Ports[0].Endpoints[0])
	if _, err := first.Sync(ctx, []*proxy.Service{web, gone, silent}, proxy.Changes{"ns/silent": silent}, false); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		start := time.Now()
		if got, err := testutil.Ask(pod, "10.246.113.30:8080"); err != nil || got != "ep "+nodeEpSide {
			t.Errorf("connection %d to a service with a silent endpoint: %q, %v", i, got, err)
		}
		t.Logf("connection %d to a service with a silent endpoint: %v", i, time.Since(start))
	}
	// Not on loopback.
	if got, err := testutil.Ask(node, fmt.Sprintf("127.0.0.1:%d", nodePort)); err == nil {
		t.Errorf("the NodePort answered on 127.0.0.1: %q", got)
	}
	first.Close()

	// A new agent, gone deleted while it was down.
	second := New(Config{NetNS: node, NodeName: "n1"})
	t.Cleanup(second.Close)
	if _, err := second.Sync(ctx, []*proxy.Service{web}, nil, true); err != nil {
		t.Fatal(err)
	}
	lo = testutil.RunIn(t, node, "ip", "-o", "addr", "show", "dev", "lo")
	if strings.Contains(lo, goneIP) || !strings.Contains(lo, clusterIP) {
		t.Errorf("after a restart, want %s kept and %s removed:\n%s", clusterIP, goneIP, lo)
	}
	if got, err := testutil.Ask(pod, clusterIP+":8080"); err != nil || got != "ep "+nodeEpSide {
		t.Errorf("after a restart: %q, %v", got, err)
	}
	second.Close()
	for range 2 {
		if err := netns.Do(node, func() error { return Cleanup(ctx) }); err != nil {
			t.Fatal(err)
		}
	}
	if lo := testutil.RunIn(t, node, "ip", "-o", "addr", "show", "dev", "lo"); strings.Contains(lo, "10.246.113.") {
		t.Errorf("Cleanup left addresses:\n%s", lo)
	}
}

// udpEchoIn answers every datagram with "udp", in namespace ns.
func udpEchoIn(t *testing.T, ns, ip string) uint16 {
	t.Helper()
	var pc net.PacketConn
	if err := netns.Do(ns, func() (err error) { pc, err = net.ListenPacket("udp", ip+":0"); return err }); err != nil {
		t.Fatal(err)
	}
	return serveUDP(t, pc, "udp").Port()
}

func udpAskIn(ns, to string) (string, error) {
	var c net.Conn
	if err := netns.Do(ns, func() (err error) { c, err = net.Dial("udp", to); return err }); err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	return udpRoundTrip(c)
}

// TestRootIPv6 serves an IPv6 ClusterIP: the /128 goes on the node's lo,
// a pod reaches it by its default route, the IPv6 backend leaves the IPv4
// backend's address alone and Cleanup removes both.
func TestRootIPv6(t *testing.T) {
	const (
		nodeSide  = "fd00:246:114::1"
		podAddr   = "fd00:246:114::2"
		clusterIP = "fd00:246:115::10"
		v4IP      = "10.246.115.10"
	)
	testutil.RequireFreeRange(t, "fd00:246:114::/64", "fd00:246:115::/64", "10.246.115.0/24")
	node, pod := testutil.NewNetNS(t), testutil.NewNetNS(t)
	testutil.Wire(t, node, testutil.Name("fun"), []string{nodeSide + "/64"}, pod, testutil.Name("fup"), []string{podAddr + "/64"})
	testutil.RunIn(t, pod, "ip", "-6", "route", "add", "default", "via", nodeSide)
	_, portStr, _ := net.SplitHostPort(testutil.EchoServer(t, pod, "["+podAddr+"]:0", "pod"))
	port, _ := strconv.Atoi(portStr)
	ep := proxy.Endpoint{IP: netip.MustParseAddr(podAddr), Port: uint16(port), Ready: true}
	ctx := context.Background()
	v4 := New(Config{NetNS: node})
	t.Cleanup(v4.Close)
	if _, err := v4.Sync(ctx, []*proxy.Service{service("v4", v4IP, proxy.TCP, 8080)}, nil, true); err != nil {
		t.Fatal(err)
	}
	v6 := New(Config{NetNS: node, IPv6: true})
	t.Cleanup(v6.Close)
	if res, err := v6.Sync(ctx, []*proxy.Service{service("v6", clusterIP, proxy.TCP, 8080, ep)}, nil, true); err != nil || len(res.Conflicts) > 0 {
		t.Fatalf("sync: %v %v", err, res.Conflicts)
	}
	lo := testutil.RunIn(t, node, "ip", "-o", "addr", "show", "dev", "lo")
	if !strings.Contains(lo, clusterIP+"/128") || !strings.Contains(lo, v4IP+"/32") {
		t.Errorf("lo, want %s/128 and %s/32:\n%s", clusterIP, v4IP, lo)
	}
	// The pod reaches its own service through the node (hairpin), and
	// sees the node's address.
	if got, err := testutil.Ask(pod, "["+clusterIP+"]:8080"); err != nil || got != "pod "+nodeSide {
		t.Errorf("pod -> [%s]:8080: %q, %v; want %q", clusterIP, got, err, "pod "+nodeSide)
	}
	v4.Close()
	v6.Close()
	if err := netns.Do(node, func() error { return Cleanup(ctx) }); err != nil {
		t.Fatal(err)
	}
	if lo := testutil.RunIn(t, node, "ip", "-o", "addr", "show", "dev", "lo"); strings.Contains(lo, clusterIP) || strings.Contains(lo, v4IP) {
		t.Errorf("Cleanup left addresses:\n%s", lo)
	}
}
