package lab

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
	"github.com/flatnet/flatnet/internal/testutil"
)

func mustPlan(t *testing.T, k kernel, s *Spec) []fix {
	t.Helper()
	fixes, err := k.plan(s)
	if err != nil {
		t.Fatal(err)
	}
	return fixes
}

// applyPlan applies the fixes s needs now.
func applyPlan(t *testing.T, k kernel, s *Spec) {
	t.Helper()
	if err := k.apply(mustPlan(t, k, s)); err != nil {
		t.Fatal(err)
	}
}

// TestKernelUnderlay builds a 2-node underlay with a test namespace
// standing in for the root namespace: nodes reach each other and the
// host address, a second ensure changes nothing, a removed veth is
// repaired, and removal leaves no namespace or interface.
func TestKernelUnderlay(t *testing.T) {
	testutil.RequireRoot(t)
	hostNS := testutil.NewNetNS(t)
	name := testutil.Name("lt")
	s, err := NewSpec(opts(name, 2), netip.MustParsePrefix("10.254.77.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	k := newKernel(hostNS)
	t.Cleanup(func() {
		for _, n := range s.Nodes {
			_ = netns.Delete(n.Netns)
		}
	})

	plan := func() []fix { t.Helper(); return mustPlan(t, k, s) }
	obs := func() (bool, []bool) {
		t.Helper()
		fixes := plan()
		var nodes []bool
		for _, n := range s.Nodes {
			nodes = append(nodes, ready(fixes, nodePart(n.Name)))
		}
		return ready(fixes, partUnderlay), nodes
	}
	if br, nodes := obs(); br || nodes[0] || nodes[1] {
		t.Fatalf("before: bridge %v nodes %v", br, nodes)
	}
	ensure := func() { t.Helper(); applyPlan(t, k, s) }
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
	if fixes := plan(); len(fixes) != 0 {
		t.Errorf("fixes on a ready lab:\n%s", fixLines(fixes))
	}
	ensure()
	if after := dump(); after != before {
		t.Errorf("second ensure changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// Drift in real namespaces: a route gone from node 1, forwarding off
	// in node 2, the bridge down: exactly those fixes, then none.
	testutil.RunIn(t, NetnsPath(s.Nodes[0].Netns), "ip", "route", "del", s.ServiceCIDR.String())
	testutil.RunIn(t, NetnsPath(s.Nodes[1].Netns), "sysctl", "-qw", "net.ipv4.ip_forward=0")
	testutil.RunIn(t, hostNS, "ip", "link", "set", s.Bridge, "down")
	want := "underlay: set " + s.Bridge + " up in the host\n" +
		"node " + s.Nodes[0].Name + ": route " + s.ServiceCIDR.String() + " dev eth0 in netns " + s.Nodes[0].Netns + "\n" +
		"node " + s.Nodes[1].Name + ": sysctl net.ipv4.ip_forward=1 in netns " + s.Nodes[1].Netns + "\n"
	if got := fixLines(plan()); got != want {
		t.Errorf("fixes after drift:\n%s\nwant:\n%s", got, want)
	}
	ensure()
	if fixes := plan(); len(fixes) != 0 {
		t.Errorf("fixes after repair:\n%s", fixLines(fixes))
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
		if err := k.removeNode(n, RouterNetns(name)); err != nil {
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
	if err := k.removeNode(s.Nodes[0], RouterNetns(name)); err != nil {
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
	// process in the namespace is sleep, not ip half-way through its exec
	// (ip's own command line names "sleep 600" too; mid-exec it reads empty).
	for range 250 {
		pids := proc.Scan(func(pid int) bool { i, ok := pidNetns(pid); return ok && i == ino })
		if len(pids) > 0 && strings.HasPrefix(cmdline(pids[0]), "sleep 600") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopped, err := stopInNetns(map[uint64]bool{ino: true}, 2*time.Second)
	if err != nil || len(stopped) != 1 || !strings.HasSuffix(stopped[0], " sleep 600") {
		t.Fatalf("stopped %v, %v", stopped, err)
	}
	<-done
	if _, err := os.Stat("/proc/" + strconv.Itoa(outside.Process.Pid)); err != nil {
		t.Fatalf("the process outside the namespace was stopped: %v", err)
	}
}

// TestStopDaemonsOf: a daemon whose pid file is lost is found by its
// command line (a binary copied into the state dir), and only the lab's
// daemons are stopped (not a process that merely names the dir).
func TestStopDaemonsOf(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	start := func(argv ...string) *exec.Cmd {
		cmd := exec.Command(argv[0], argv[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	var daemons []*exec.Cmd
	for _, d := range []string{dir, other} {
		if err := os.MkdirAll(d+"/bin", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(d+"/bin/flatnet", b, 0o755); err != nil {
			t.Fatal(err)
		}
		daemons = append(daemons, start(d+"/bin/flatnet", "300"))
	}
	// $0 names a file in the dir; the shell loops until signalled.
	reader := start("sh", "-c", "while :; do sleep 1; done", dir+"/logs/controller.log")
	done := make(chan error, 1)
	go func() { done <- daemons[0].Wait() }()
	if stopped, err := stopDaemonsOf(dir, flatnetDaemon("agent"), 5*time.Second); err != nil || stopped != "" {
		t.Fatalf("stopped as an agent: %q, %v", stopped, err)
	}
	stopped, err := stopDaemonsOf(dir, anyDaemon, 5*time.Second)
	if err != nil || !strings.HasPrefix(stopped, ", 1 without a usable pid file stopped (") || !strings.Contains(stopped, dir+"/bin/flatnet 300") {
		t.Fatalf("stopped %q, %v", stopped, err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the lab's daemon still runs")
	}
	if daemonOf(daemons[1].Process.Pid, other) == nil {
		t.Error("another lab's daemon was stopped")
	}
	if !strings.Contains(cmdline(reader.Process.Pid), "controller.log") {
		t.Error("a process naming a file in the dir was stopped")
	}
}

// TestKernelTwoSubnets builds a two-subnet underlay with an external host,
// a test namespace standing in for the root one: nodes on either subnet
// reach each other, the host and the external host through the router
// with their own addresses; nothing has a default route; a second ensure
// changes nothing; a rebuilt router is detected and repaired; removal
// leaves nothing in the host namespace.
func TestKernelTwoSubnets(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireFreeRange(t, "10.254.78.0/24", "10.254.79.0/24")
	hostNS := testutil.NewNetNS(t)
	name := testutil.Name("lt")
	o := opts(name, 3)
	o.Backend, o.Subnets, o.External = "vxlan", 2, true
	s, err := NewSpec(o, netip.MustParsePrefix("10.254.78.0/24"), netip.MustParsePrefix("10.254.79.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	k := newKernel(hostNS)
	t.Cleanup(func() {
		for _, n := range s.Nodes {
			_ = netns.Delete(n.Netns)
		}
		_ = netns.Delete(s.Router.Netns)
		_ = netns.Delete(s.External.Netns)
	})
	if s.Nodes[1].Subnet != 1 || s.Nodes[1].IP.String() != "10.254.79.12" || s.Nodes[2].IP.String() != "10.254.78.13" {
		t.Fatalf("layout: %+v", s.Nodes)
	}

	plan := func() []fix { t.Helper(); return mustPlan(t, k, s) }
	ready := func() string {
		t.Helper()
		fixes := plan()
		parts := []struct {
			what string
			id   partID
		}{{"bridge", partUnderlay}, {"router", partRouter}}
		for _, n := range s.Nodes {
			parts = append(parts, struct {
				what string
				id   partID
			}{n.Name[len(name)+1:], nodePart(n.Name)})
		}
		parts = append(parts, struct {
			what string
			id   partID
		}{"external", partExternal})
		var b strings.Builder
		for _, p := range parts {
			fmt.Fprintf(&b, "%s=%v ", p.what, !slices.ContainsFunc(fixes, func(f fix) bool { return f.part == p.id }))
		}
		return strings.TrimSpace(b.String())
	}
	if got := ready(); strings.Contains(got, "true") {
		t.Fatalf("before: %s", got)
	}
	ensure := func() { t.Helper(); applyPlan(t, k, s) }
	ensure()
	allReady := "bridge=true router=true node1=true node2=true node3=true external=true"
	if got := ready(); got != allReady {
		t.Fatalf("after ensure: %s", got)
	}

	// What a lost lab.json held is read back from these objects.
	if r, err := readRunningLab(k, t.TempDir(), name); err != nil || r.nodes != 3 || !r.external ||
		joinPrefixes(r.underlays) != "10.254.78.0/24,10.254.79.0/24" {
		t.Errorf("read back from the kernel: %+v, %v", r, err)
	}

	// Everyone serves; everyone asks everyone, and the answer names the
	// asker's own address (no NAT anywhere on the underlay).
	type host struct {
		name, ns string
		ip       netip.Addr
	}
	hosts := []host{{"host", hostNS, s.HostAddr}, {"external", NetnsPath(s.External.Netns), s.External.IP}}
	for _, n := range s.Nodes {
		hosts = append(hosts, host{n.Name, NetnsPath(n.Netns), n.IP})
	}
	srv := map[string]string{}
	for _, h := range hosts {
		srv[h.name] = testutil.EchoServer(t, h.ns, h.ip.String()+":0", h.name)
	}
	for _, a := range hosts {
		for _, b := range hosts {
			if a.name == b.name {
				continue
			}
			got, err := testutil.Ask(a.ns, srv[b.name])
			if want := b.name + " " + a.ip.String(); err != nil || got != want {
				t.Errorf("%s -> %s: %q, %v; want %q", a.name, b.name, got, err, want)
			}
		}
	}
	for _, ns := range []string{NetnsPath(s.Router.Netns), NetnsPath(s.External.Netns), NetnsPath(s.Nodes[0].Netns), NetnsPath(s.Nodes[1].Netns)} {
		if got := strings.TrimSpace(testutil.RunIn(t, ns, "ip", "-4", "route", "show", "default")); got != "" {
			t.Errorf("%s has a default route: %s", ns, got)
		}
	}
	if got := testutil.RunIn(t, hostNS, "ip", "-4", "route", "show", "10.254.79.0/24"); !strings.Contains(got, "via 10.254.78.254 dev "+s.Bridge) {
		t.Errorf("host route to the second underlay: %q", got)
	}

	dump := func() string {
		var b strings.Builder
		b.WriteString(testutil.RunIn(t, hostNS, "ip", "-o", "link") + testutil.RunIn(t, hostNS, "ip", "-o", "-4", "addr") + testutil.RunIn(t, hostNS, "ip", "-4", "route"))
		for _, ns := range []string{s.Router.Netns, s.External.Netns, s.Nodes[1].Netns} {
			b.WriteString(testutil.RunIn(t, NetnsPath(ns), "ip", "-o", "link") + testutil.RunIn(t, NetnsPath(ns), "ip", "-o", "-4", "addr") + testutil.RunIn(t, NetnsPath(ns), "ip", "-4", "route"))
		}
		return b.String()
	}
	before := dump()
	ensure()
	if after := dump(); after != before {
		t.Errorf("second ensure changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// A node's route to the other subnet is part of being wired: exactly
	// that fix.
	testutil.RunIn(t, NetnsPath(s.Nodes[0].Netns), "ip", "route", "del", "10.254.79.0/24")
	want := "node " + s.Nodes[0].Name + ": route 10.254.79.0/24 via 10.254.78.254 dev eth0 in netns " + s.Nodes[0].Netns + "\n"
	if got := fixLines(plan()); got != want {
		t.Errorf("node 1 without its route:\n%s\nwant:\n%s", got, want)
	}
	// The router rebuilt from nothing: the second subnet's nodes lose
	// their veths with it.
	if err := netns.Delete(s.Router.Netns); err != nil {
		t.Fatal(err)
	}
	if got := ready(); got != "bridge=true router=false node1=false node2=false node3=true external=true" {
		t.Errorf("router gone: %s", got)
	}
	ensure()
	if got := ready(); got != allReady {
		t.Fatalf("after repair: %s", got)
	}
	srv[s.Nodes[1].Name] = testutil.EchoServer(t, NetnsPath(s.Nodes[1].Netns), s.Nodes[1].IP.String()+":0", s.Nodes[1].Name)
	if got, err := testutil.Ask(hostNS, srv[s.Nodes[1].Name]); err != nil || got != s.Nodes[1].Name+" "+s.HostAddr.String() {
		t.Errorf("host -> node 2 after repair: %q, %v", got, err)
	}

	for _, n := range s.Nodes {
		if err := k.removeNode(n, s.Router.Netns); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.removeRouter(name); err != nil {
		t.Fatal(err)
	}
	if err := k.removeExternal(name); err != nil {
		t.Fatal(err)
	}
	if err := k.removeBridge(s); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{s.Router.Netns, s.External.Netns, s.Nodes[0].Netns, s.Nodes[1].Netns} {
		if _, err := os.Stat(NetnsPath(ns)); err == nil {
			t.Errorf("netns %s still there", ns)
		}
	}
	if links := testutil.RunIn(t, hostNS, "ip", "-o", "link"); strings.Contains(links, "fl-") || strings.Contains(links, "fr-") || strings.Contains(links, "fx-") {
		t.Errorf("links left in the host namespace:\n%s", links)
	}
	if routes := testutil.RunIn(t, hostNS, "ip", "-4", "route"); strings.TrimSpace(routes) != "" {
		t.Errorf("routes left in the host namespace:\n%s", routes)
	}
	// Removing again is fine.
	if err := k.removeRouter(name); err != nil {
		t.Fatal(err)
	}
	if err := k.removeNode(s.Nodes[1], s.Router.Netns); err != nil {
		t.Fatal(err)
	}
}
