package lab

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func lbOpts(name string, nodes int) Options {
	o := opts(name, nodes)
	o.External, o.LBPool = true, DefaultLBPool
	return o
}

func TestLBPoolSpec(t *testing.T) {
	s, err := NewSpec(lbOpts("flatnet", 3), DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	if s.LBPool.String() != "10.251.0.0/24" || s.LoadBalancerPool() != "10.251.0.1-10.251.0.127" || s.ExternalIPRange().String() != "10.251.0.128/25" {
		t.Errorf("pool %s, controller's %s, externalIPs %s", s.LBPool, s.LoadBalancerPool(), s.ExternalIPRange())
	}
	small, err := NewSpec(func() Options { o := lbOpts("flatnet", 1); o.LBPool = "10.9.0.8/29"; return o }(), DefaultUnderlay("flatnet"))
	if err != nil || small.LoadBalancerPool() != "10.9.0.9-10.9.0.11" || small.ExternalIPRange().String() != "10.9.0.12/30" {
		t.Errorf("a /29: %v %q %s", err, small.LoadBalancerPool(), small.ExternalIPRange())
	}
	// The controller gets the lower half; the Options round trip keeps it.
	if got := strings.Join(controllerArgv(s), " "); !strings.HasSuffix(got, " --endpointslices --load-balancer-ip-pool 10.251.0.1-10.251.0.127") {
		t.Errorf("controller argv: %s", got)
	}
	if o := s.Options(); o.LBPool != "10.251.0.0/24" {
		t.Errorf("Options().LBPool = %q", o.LBPool)
	}
	// No pool: no flag, no route.
	none, err := NewSpec(opts("flatnet", 3), DefaultUnderlay("flatnet"))
	if err != nil || none.LBPool.IsValid() || none.LoadBalancerPool() != "" || strings.Contains(strings.Join(controllerArgv(none), " "), "load-balancer") {
		t.Errorf("without a pool: %v %v %q", err, none.LBPool, controllerArgv(none))
	}
}

func TestLBPoolSpecErrors(t *testing.T) {
	for _, c := range []struct{ pool, want string }{
		{"10.251.0.0/30", "--lb-pool 10.251.0.0/30: want a /29 or larger"},
		{"10.251.0.1/24", "--lb-pool 10.251.0.1/24: host bits set; did you mean 10.251.0.0/24?"},
		{"fd00::/64", "--lb-pool fd00::/64: the lab is IPv4 only for now"},
		{"10.250.0.128/25", "the load-balancer pool 10.250.0.128/25 overlaps the underlay 10.250.0.0/24; they must be disjoint"},
		{"10.244.3.0/24", "the cluster CIDR 10.244.0.0/16 overlaps the load-balancer pool 10.244.3.0/24; they must be disjoint"},
		{"10.96.0.0/24", "the load-balancer pool 10.96.0.0/24 overlaps the service CIDR 10.96.0.0/16; they must be disjoint"},
	} {
		o := lbOpts("flatnet", 1)
		o.LBPool = c.pool
		if _, err := NewSpec(o, DefaultUnderlay("flatnet")); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--lb-pool %s: %v, want %q", c.pool, err, c.want)
		}
	}
}

func TestLBPoolResolve(t *testing.T) {
	p := netip.MustParsePrefix
	req := func(pool string, changed ...string) Request {
		r := Request{Options: lbOpts("lab1", 3), Changed: map[string]bool{}}
		r.LBPool = pool
		for _, c := range changed {
			r.Changed[c] = true
		}
		return r
	}
	// The machine's routes are checked as for the other ranges.
	_, err := resolve(req(DefaultLBPool), nil, []netip.Prefix{p("10.251.0.0/16")}, nil)
	if err == nil || err.Error() != "the lab's load-balancer pool 10.251.0.0/24 overlaps 10.251.0.0/16, which this machine already uses (see `ip route`); refusing: pick another range with --lb-pool" {
		t.Fatalf("host overlap: %v", err)
	}
	// Other labs' underlays do not matter (the route lives in this lab's
	// external host only).
	if _, err := resolve(req("10.250.200.0/24"), nil, nil, []netip.Prefix{p("10.250.200.0/24")}); err != nil {
		t.Fatalf("another lab's underlay: %v", err)
	}

	rec, err := NewSpec(lbOpts("lab1", 3), p("10.250.9.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if s, err := resolve(req("10.99.0.0/24"), rec, nil, nil); err != nil || s.LBPool != rec.LBPool {
		t.Fatalf("rerun with another default: %v %v", s, err)
	}
	if s, err := resolve(req("10.251.0.0/24", "lb-pool"), rec, nil, nil); err != nil || s.LBPool != rec.LBPool {
		t.Fatalf("same pool given: %v %v", s, err)
	}
	if _, err := resolve(req("10.99.0.0/24", "lb-pool"), rec, nil, nil); err == nil || !strings.Contains(err.Error(), "runs with --lb-pool 10.251.0.0/24, not 10.99.0.0/24") {
		t.Fatalf("changed pool: %v", err)
	}
	// A lab recorded before --lb-pool gets the requested one.
	old, err := NewSpec(opts("lab1", 3), p("10.250.9.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if s, err := resolve(req(DefaultLBPool), old, nil, nil); err != nil || s.LBPool.String() != DefaultLBPool {
		t.Fatalf("old lab: %v %v", s, err)
	}
}

// An old lab.json (no lbPool) still loads, and one with the pool round
// trips.
func TestLBPoolRecord(t *testing.T) {
	dir := t.TempDir()
	for _, o := range []Options{opts("old", 2), lbOpts("new", 2)} {
		s, err := NewSpec(o, netip.MustParsePrefix("10.250.5.0/24"))
		if err != nil {
			t.Fatal(err)
		}
		s.StateDir = filepath.Join(dir, o.Name)
		if err := saveRecord(&record{Spec: *s}); err != nil {
			t.Fatal(err)
		}
		r, err := loadRecord(dir, o.Name)
		if err != nil || r.LBPool != s.LBPool {
			t.Errorf("%s: %v, pool %v want %v", o.Name, err, r.LBPool, s.LBPool)
		}
		b, _ := json.Marshal(r)
		if strings.Contains(string(b), "lbPool") != (o.LBPool != "") {
			t.Errorf("%s: lab.json %s", o.Name, b)
		}
	}
}

func TestLBPoolExternalRoute(t *testing.T) {
	s, err := NewSpec(lbOpts("flatnet", 3), DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	e := s.externalEndpoint()
	if len(e.routes) != 1 || e.routes[0].String() != "10.251.0.0/24 via 10.250.0.11 10.250.0.12 10.250.0.13 dev eth0" ||
		len(e.sysctls) != 1 || e.sysctls[0].value != "1" {
		t.Errorf("external endpoint: %+v", e)
	}
	// Two subnets: only the nodes on the external host's own underlay.
	o := twoSubnetOpts("flatnet", 4)
	o.LBPool = DefaultLBPool
	s2, err := NewSpec(o, netip.MustParsePrefix("10.250.0.0/24"), netip.MustParsePrefix("10.250.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if e := s2.externalEndpoint(); len(e.routes) != 2 || e.routes[1].String() != "10.251.0.0/24 via 10.250.0.11 10.250.0.13 dev eth0" {
		t.Errorf("two subnets: %+v", e)
	}
	// One node: a plain route.
	s1, _ := NewSpec(lbOpts("flatnet", 1), DefaultUnderlay("flatnet"))
	if e := s1.externalEndpoint(); len(e.routes) != 1 || e.routes[0].String() != "10.251.0.0/24 via 10.250.0.11 dev eth0" || len(e.sysctls) != 0 {
		t.Errorf("one node: %+v", e)
	}
}

func TestLBPoolPlanAndStatus(t *testing.T) {
	s, err := NewSpec(lbOpts("flatnet", 1), DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	all := Observed{StateDir: true, Bin: true, Underlay: true, ControlPlane: true, Controller: true, External: true, ExternalServer: true,
		Nodes: map[string]bool{"flatnet-node1": true}, Agents: map[string]bool{"flatnet-node1": true}}
	ctl := func(o Observed) Step {
		for _, st := range Plan(s, o) {
			if st.Kind == StepController {
				return st
			}
		}
		t.Fatal("no controller step")
		return Step{}
	}
	if st := ctl(all); st.Present || !st.Restart || st.What != "flatnet controller (node IPAM, EndpointSlices); LoadBalancer IPs 10.251.0.1-10.251.0.127, was none" {
		t.Errorf("controller without the pool: %+v", st)
	}
	all.ControllerLBPool = "10.251.0.1-10.251.0.127"
	if st := ctl(all); !st.Present || st.Restart || st.What != "flatnet controller (node IPAM, EndpointSlices)" {
		t.Errorf("controller with the pool: %+v", st)
	}
	for _, st := range Plan(s, all) {
		if st.Kind == StepExternal && !strings.Contains(st.What, "route 10.251.0.0/24 via 10.250.0.11") {
			t.Errorf("external step: %s", st.What)
		}
	}

	var b bytes.Buffer
	(&Status{Spec: s, External: true}).Print(&b)
	if want := "load balancer: 10.251.0.0/24: LoadBalancer IPs 10.251.0.1-10.251.0.127, externalIPs 10.251.0.128/25; routed to the nodes from the external host\n"; !strings.Contains(b.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, b.String())
	}
}

// TestKernelLBRoute wires a 3-node lab with the external host in a
// namespace standing in for the root one: the external host routes the
// load-balancer range over every node (connections to one address spread
// over them), a second ensure changes nothing, a grown lab's route gets
// the new node, and the root stand-in has no route to the range.
func TestKernelLBRoute(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireFreeRange(t, "10.254.76.0/24")
	hostNS := testutil.NewNetNS(t)
	name := testutil.Name("lt")
	o := lbOpts(name, 3)
	o.LBPool = "10.251.76.0/24"
	s, err := NewSpec(o, netip.MustParsePrefix("10.254.76.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	k := newKernel(hostNS)
	t.Cleanup(func() {
		for _, n := range append(s.Nodes, Node{Netns: NodeNetns(name, 4)}) {
			_ = netns.Delete(n.Netns)
		}
		_ = netns.Delete(s.External.Netns)
	})
	ensure := func(s *Spec) { t.Helper(); applyPlan(t, k, s) }
	ensure(s)
	if fixes := mustPlan(t, k, s); len(fixes) != 0 {
		t.Fatalf("not ready after ensure:\n%s", fixLines(fixes))
	}
	ext := NetnsPath(s.External.Netns)
	route := func() string { return testutil.RunIn(t, ext, "ip", "-4", "route", "show", "10.251.76.0/24") }
	for _, n := range s.Nodes {
		if !strings.Contains(route(), "nexthop via "+n.IP.String()+" dev eth0") {
			t.Errorf("external route lacks %s:\n%s", n.IP, route())
		}
	}
	if got := strings.TrimSpace(testutil.RunIn(t, ext, "sysctl", "-n", "net.ipv4.fib_multipath_hash_policy")); got != "1" {
		t.Errorf("fib_multipath_hash_policy = %q", got)
	}
	if got := testutil.RunIn(t, hostNS, "ip", "-4", "route", "show", "10.251.76.0/24"); strings.TrimSpace(got) != "" {
		t.Errorf("the root stand-in routes the range: %s", got)
	}

	// Every node answers 10.251.76.1 (on its lo, as a proxy's DNAT would
	// take it); connections from the external host spread over them.
	vip := "10.251.76.1"
	for _, n := range s.Nodes {
		testutil.RunIn(t, NetnsPath(n.Netns), "ip", "addr", "add", vip+"/32", "dev", "lo")
		testutil.EchoServer(t, NetnsPath(n.Netns), vip+":18080", n.Name)
	}
	seen := map[string]int{}
	for range 60 {
		got, err := testutil.Ask(ext, vip+":18080")
		if err != nil {
			t.Fatalf("external host -> %s: %v", vip, err)
		}
		node, client, _ := strings.Cut(got, " ")
		if client != s.External.IP.String() {
			t.Errorf("answer %q: the node saw another client than %s", got, s.External.IP)
		}
		seen[node]++
	}
	// 60 connections hashed by port over 3 nodes: all on one node has a
	// probability of 3^-59.
	if len(seen) < 2 {
		t.Errorf("connections did not spread over the nodes: %v", seen)
	}

	dump := func() string {
		return testutil.RunIn(t, ext, "ip", "-4", "route") + testutil.RunIn(t, hostNS, "ip", "-4", "route") + testutil.RunIn(t, hostNS, "ip", "-o", "link")
	}
	before := dump()
	ensure(s)
	if after := dump(); after != before {
		t.Errorf("second ensure changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// A fourth node: the route is no longer ready, and ensure adds it.
	o.Nodes = 4
	s4, err := NewSpec(o, s.Underlay)
	if err != nil {
		t.Fatal(err)
	}
	if fixes := fixesOf(mustPlan(t, k, s4), partExternal); len(fixes) != 1 ||
		fixes[0].String() != "external host: route 10.251.76.0/24 via 10.254.76.11 10.254.76.12 10.254.76.13 10.254.76.14 dev eth0 in netns "+s.External.Netns {
		t.Errorf("external host with a route over 3 of 4 nodes: fixes\n%s", fixLines(fixes))
	}
	ensure(s4)
	if !strings.Contains(route(), "nexthop via "+s4.Nodes[3].IP.String()+" dev eth0") || strings.Count(route(), "nexthop") != 4 {
		t.Errorf("route after growing:\n%s", route())
	}
}

// testutil.LabRanges, which root tests beside a lab keep out of, holds
// every range a lab takes in the host namespace by default.
func TestLabRangesCoverTheDefaults(t *testing.T) {
	for _, r := range []netip.Prefix{netip.MustParsePrefix(DefaultClusterCIDR), underlayBase, netip.MustParsePrefix(DefaultLBPool)} {
		if !slices.ContainsFunc(testutil.LabRanges, func(l netip.Prefix) bool { return l.Bits() <= r.Bits() && l.Contains(r.Addr()) }) {
			t.Errorf("testutil.LabRanges %v lacks %s", testutil.LabRanges, r)
		}
	}
}
