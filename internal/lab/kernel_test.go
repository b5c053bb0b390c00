package lab

import (
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestKernelUnderlay builds a 2-node underlay with a test namespace
// standing in for the root namespace: nodes reach each other and the
// host address, a second ensure changes nothing, a removed veth is
// repaired, and removal leaves no namespace or interface.
func TestKernelUnderlay(t *testing.T) {
	testutil.RequireRoot(t)
	hostNS := testutil.NewNetNS(t)
	name := testutil.Name("lt")
	s, err := NewSpec(opts(name, 2), netip.MustParsePrefix("10.250.77.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	k := kernel{hostNS: hostNS}
	t.Cleanup(func() {
		for _, n := range s.Nodes {
			_ = netns.Delete(n.Netns)
		}
	})

	obs := func() (bool, []bool) {
		br, err := k.bridgeReady(s)
		if err != nil {
			t.Fatal(err)
		}
		var nodes []bool
		for _, n := range s.Nodes {
			ok, err := k.nodeReady(s, n)
			if err != nil {
				t.Fatal(err)
			}
			nodes = append(nodes, ok)
		}
		return br, nodes
	}
	if br, nodes := obs(); br || nodes[0] || nodes[1] {
		t.Fatalf("before: bridge %v nodes %v", br, nodes)
	}
	ensure := func() {
		t.Helper()
		if err := k.ensureBridge(s); err != nil {
			t.Fatal(err)
		}
		for _, n := range s.Nodes {
			if err := k.ensureNode(s, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	ensure()
	if br, nodes := obs(); !br || !nodes[0] || !nodes[1] {
		t.Fatalf("after ensure: bridge %v nodes %v", br, nodes)
	}
	// TCP through the underlay: each node serves, the others ask.
	srv := map[string]string{}
	for _, n := range s.Nodes {
		srv[n.Name] = testutil.EchoServer(t, NetnsPath(n.Netns), n.IP.String()+":0", n.Name)
	}
	ask := func(fromNS string, node Node, fromIP string) {
		t.Helper()
		got, err := testutil.Ask(fromNS, srv[node.Name])
		if want := node.Name + " " + fromIP; err != nil || got != want {
			t.Fatalf("asking %s from %s: %q, %v; want %q", node.Name, fromNS, got, err, want)
		}
	}
	ask(NetnsPath(s.Nodes[0].Netns), s.Nodes[1], s.Nodes[0].IP.String())
	ask(hostNS, s.Nodes[0], s.HostAddr.String())
	if got := strings.TrimSpace(testutil.RunIn(t, NetnsPath(s.Nodes[0].Netns), "ip", "-4", "route", "show", "default")); got != "" {
		t.Errorf("node has a default route: %s", got)
	}

	dump := func() string {
		return testutil.RunIn(t, hostNS, "ip", "-o", "link") + testutil.RunIn(t, hostNS, "ip", "-o", "-4", "addr") +
			testutil.RunIn(t, NetnsPath(s.Nodes[0].Netns), "ip", "-o", "-4", "addr")
	}
	before := dump()
	ensure()
	if after := dump(); after != before {
		t.Errorf("second ensure changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// Repair: the host veth of node 2 is deleted (its eth0 goes with it).
	testutil.RunIn(t, hostNS, "ip", "link", "del", s.Nodes[1].HostVeth)
	if _, nodes := obs(); nodes[1] {
		t.Fatal("node 2 still reported ready without its veth")
	}
	ensure()
	srv[s.Nodes[1].Name] = testutil.EchoServer(t, NetnsPath(s.Nodes[1].Netns), s.Nodes[1].IP.String()+":0", s.Nodes[1].Name)
	ask(NetnsPath(s.Nodes[0].Netns), s.Nodes[1], s.Nodes[0].IP.String())

	for _, n := range s.Nodes {
		if err := k.removeNode(n); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(NetnsPath(n.Netns)); err == nil {
			t.Errorf("netns %s still there", n.Netns)
		}
	}
	if err := k.removeBridge(s); err != nil {
		t.Fatal(err)
	}
	if links := testutil.RunIn(t, hostNS, "ip", "-o", "link"); strings.Contains(links, "fl-") {
		t.Errorf("links left in the host namespace:\n%s", links)
	}
	// Removing again is fine.
	if err := k.removeBridge(s); err != nil {
		t.Fatal(err)
	}
	if err := k.removeNode(s.Nodes[0]); err != nil {
		t.Fatal(err)
	}
}

// TestStopInNetns starts processes in a namespace and checks that only
// they are stopped.
func TestStopInNetns(t *testing.T) {
	testutil.RequireRoot(t)
	ns := testutil.NewNetNS(t)
	inside := exec.Command("ip", "netns", "exec", testutil.NSName(ns), "sleep", "600")
	if err := inside.Start(); err != nil {
		t.Fatal(err)
	}
	outside := exec.Command("sleep", "600")
	if err := outside.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = outside.Process.Kill(); _ = outside.Wait() })
	done := make(chan error, 1)
	go func() { done <- inside.Wait() }()
	ino, err := netnsInode(ns)
	if err != nil {
		t.Fatal(err)
	}
	// ip netns exec enters the namespace, then execs sleep: wait until the
	// process in the namespace is sleep, not ip half-way through its exec.
	for range 250 {
		pids := pidsInNetns(map[uint64]bool{ino: true})
		if len(pids) > 0 && strings.Contains(cmdline(pids[0]), "sleep 600") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopped, err := stopInNetns(map[uint64]bool{ino: true}, 2*time.Second)
	if err != nil || len(stopped) != 1 || !strings.Contains(stopped[0], "sleep 600") {
		t.Fatalf("stopped %v, %v", stopped, err)
	}
	<-done
	if _, err := os.Stat("/proc/" + strconv.Itoa(outside.Process.Pid)); err != nil {
		t.Fatalf("the process outside the namespace was stopped: %v", err)
	}
}
